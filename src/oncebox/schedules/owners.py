"""Who holds a running fan-out, and whether it is still there.

A run's lease is kept by progress: each batch enqueued extends it (`schedule_run_extend`), and
one that runs out lets the next ticker or trigger resume the run. That alone cannot tell a dead
owner from a slow one for the lease's length (five minutes by default) — so while it fans out,
an owner also *renews* its run every `RENEW_EVERY` from a thread of its own, whatever its
batches do (`Renewal`). An owner not heard from for `LIVE_WITHIN` stopped renewing: its process
is gone, or cut off from the store — `status` says so, and an operator may take its run over at
once (`oncebox schedule run --take-over`, fenced on the run as read: `fanout.take_over`). An
owner judged gone that was only cut off loses nothing it committed: its next extend finds the
run taken and it stops, and a key enqueued twice is enqueued once.

A run claimed by a release that does not renew (no `renewed_at`, or one older than its claim)
is judged by its lease alone: alive until the lease ends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from oncebox.store.protocol import Store

log = logging.getLogger("oncebox.schedule")

RENEW_EVERY = timedelta(seconds=10)  # an owner's renewals, while it fans out
LIVE_WITHIN = 3 * RENEW_EVERY  # an owner renewed this recently is alive (as workers: 3 beats)


class HeldRun(Protocol):
    """A run as read (a `ScheduleRunRow`, or a running period's `PeriodStats`)."""

    @property
    def owner(self) -> str | None: ...
    @property
    def lease_expires_at(self) -> datetime | None: ...
    @property
    def renewed_at(self) -> datetime | None: ...
    @property
    def started_at(self) -> datetime | None: ...


@dataclass(frozen=True)
class RunOwner:
    """A running fan-out's owner, judged at `now`."""

    owner: str
    live: bool
    renewed_at: datetime | None  # None: an owner that does not renew (judged by its lease)
    lease_ends_at: datetime
    now: datetime

    @property
    def lease_ended(self) -> bool:
        """The lease ran out: the next ticker or trigger resumes the run, whoever owns it."""
        return self.lease_ends_at < self.now

    @property
    def gone(self) -> bool:
        """Nobody is fanning this run out: its owner stopped renewing, or its lease ran out."""
        return not self.live or self.lease_ended


def judge(run: HeldRun, now: datetime) -> RunOwner | None:
    """Who holds `run` and whether they are alive at `now` (None: nobody holds it — done)."""
    if run.owner is None or run.lease_expires_at is None:
        return None
    renewed = run.renewed_at
    if renewed is not None and run.started_at is not None and renewed < run.started_at:
        renewed = None  # a renewal from before this claim: the owner now does not renew
    live = run.lease_expires_at >= now if renewed is None else now - renewed <= LIVE_WITHIN
    return RunOwner(run.owner, live, renewed, run.lease_expires_at, now)


@contextlib.contextmanager
def renewing(store: Store, schedule: str, period: str, owner: str) -> Iterator[None]:
    """Renew the run from a thread of its own while the block fans it out. It stops when the
    block ends, or once a renewal finds the run taken over or done (the fan-out itself learns
    that at its next batch); a renewal that fails is tried again at the next."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(RENEW_EVERY.total_seconds()):
            try:
                if not store.schedule_run_renew(schedule, period, owner):
                    return
            except Exception as exc:  # the store away: the fan-out meets it too, or it returns
                log.warning("schedule %s %s: a renewal failed (%s)", schedule, period, exc)

    thread = threading.Thread(target=renew, name=f"oncebox-renew-{period}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
