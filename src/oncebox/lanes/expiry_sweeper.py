"""`ExpirySweeper`: the lane that runs one declared sweeper (see `sweeper.py`): the transition
and its notices' claims and outbox rows in one transaction."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta

from oncebox.jobs.keys import validate_key
from oncebox.kernel import points
from oncebox.lanes.lane import configured, run_forever
from oncebox.outbox.writer import OutboxWriter
from oncebox.runtime.runtime import Runtime
from oncebox.store.params import ConsumerSettings, IntentClaim
from oncebox.store.protocol import ConsumerSession
from oncebox.timers.sweeper import SweepContext, Sweeper


@dataclass(frozen=True)
class ExpirySweeperConfig:
    """How long its transaction waits for a row lock (the sweeper's pace, batch and timeout are
    declared with it: `Box.sweeper`)."""

    lock_timeout: timedelta = timedelta(seconds=2)


@dataclass
class SweepResult:
    handled: int = 0
    notices: int = 0
    duplicates: int = 0
    keys: list[str] = field(default_factory=list)


class ExpirySweeper:
    """The lane for one sweeper, on its own connection."""

    def __init__(
        self,
        runtime: Runtime,
        sweeper: Sweeper,
        lock_timeout: timedelta | None = None,
        *,
        config: ExpirySweeperConfig | None = None,
    ) -> None:
        self.runtime = runtime
        self.sweeper = sweeper
        self.config = configured(config, ExpirySweeperConfig, lock_timeout=lock_timeout)
        self.session: ConsumerSession = runtime.store.consumer_session(
            ConsumerSettings(
                lock_timeout=self.config.lock_timeout,
                transaction_timeout=sweeper.timeout,
                application_name=f"oncebox sweeper {sweeper.name}"[:63],
            )
        )

    def run_once(self) -> SweepResult:
        result = SweepResult()
        writers: dict[str, OutboxWriter] = {}
        now = self.runtime.store.clock_now()

        def notice(key: str) -> OutboxWriter:
            validate_key(key)
            if key not in writers:
                writers[key] = self.runtime.outbox_writer(key, None, now)
            return writers[key]

        with self.session.transaction() as tx:
            with tx.handler_scope() as connection:
                ctx = SweepContext(
                    connection, now, self.sweeper.batch_size, self.session.dialect, notice
                )
                result.handled = int(self.sweeper.handler(ctx) or 0)
            claims = [
                IntentClaim(key, f"sweeper:{self.sweeper.name}", None) for key in sorted(writers)
            ]
            claimed = tx.intent_claim(claims)
            rows = [row for key in sorted(claimed) for row in writers[key].rows]
            tx.outbox_insert(rows)
            result.notices = len(claimed)
            result.duplicates = len(writers) - len(claimed)
            result.keys = sorted(claimed)
            points.reach("sweeper.after_transition_before_commit")
        return result

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            return self.run_once().handled >= self.sweeper.batch_size

        run_forever(f"sweeper {self.sweeper.name}", once, stop, self.sweeper.every.total_seconds())

    def close(self) -> None:
        self.session.close()
