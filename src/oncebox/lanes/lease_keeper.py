"""`LeaseKeeper`: heartbeats for held leases, and the hung-handler watchdog.

While a batch is held, its lease deadline is pushed out every `interval` (a third of the lease),
so a long handler keeps its jobs and a dead worker loses them within one lease. A handler past its
timeout stops being heartbeated — its lease runs out — and past timeout + grace the watchdog ends
the process (see `watch.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from oncebox.lanes.lane import run_forever
from oncebox.queue.watch import HandlerWatch
from oncebox.store.protocol import Store


@dataclass(frozen=True)
class LeaseKeeperConfig:
    lease: timedelta = timedelta(seconds=30)

    @property
    def interval(self) -> float:
        return self.lease.total_seconds() / 3


@dataclass(frozen=True)
class LeaseKeeperResult:
    tokens: int
    extended: int
    overdue: int


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        config: LeaseKeeperConfig,
        watch: HandlerWatch,
        held_tokens: Callable[[], list[str]],
        keep_alive: Callable[[timedelta], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.watch = watch
        self.held_tokens = held_tokens
        # the broker lanes' own holds, for a broker whose hold runs out by itself (SQS)
        self.keep_alive = keep_alive

    def run_once(self) -> LeaseKeeperResult:
        overdue = self.watch.check()
        tokens = self.held_tokens()
        extended = 0
        # a lease whose handler overran its timeout is left to run out; the others are kept
        overrun = {run.token for run in self.watch.overdue()}
        tokens = [token for token in tokens if token not in overrun]
        if tokens:
            extended = self.store.job_lease_extend(tokens, self.config.lease)
        if self.keep_alive is not None:
            self.keep_alive(self.config.lease)
        return LeaseKeeperResult(len(tokens), extended, len(overdue))

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            self.run_once()
            return False

        run_forever("lease keeper", once, stop, min(self.config.interval, 1.0))
