"""One period's fan-out: claim the run, stream the eligible set, enqueue it in batches — and a
manual re-run of a period (see `schedule.py` for the rules both follow)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from oncebox import points
from oncebox.errors import InvalidArguments, InvalidState
from oncebox.jobs.keys import key_problem
from oncebox.queue.enqueue import enqueue_many
from oncebox.runtime import Runtime
from oncebox.schedules.schedule import Schedule, ScheduleContext
from oncebox.store.base import ScheduleRunClaim, ScheduleRunRef, Store

log = logging.getLogger("oncebox.schedule")


@dataclass
class FanOutResult:
    schedule: str
    period: str
    claimed: bool
    eligible: int = 0
    enqueued: int = 0
    late: bool = False
    fire_at: datetime | None = None  # the fire the run answers (None: a manual re-run)


def _batches(rows: Iterable[Mapping[str, Any]], size: int) -> Iterator[list[Mapping[str, Any]]]:
    iterator = iter(rows)
    while batch := list(islice(iterator, size)):
        yield batch


class FanOut:
    """One period's fan-out: claim the run, stream the eligible set, enqueue in batches."""

    def __init__(self, runtime: Runtime, owner: str) -> None:
        self.runtime = runtime
        self.store: Store = runtime.store
        self.owner = owner

    def run(
        self,
        schedule: Schedule,
        period: str,
        fire_at: datetime | None,
        *,
        late: bool = False,
        rescan: bool = False,
    ) -> FanOutResult:
        return self.fan(schedule, self.claim(schedule, period, fire_at, late=late, rescan=rescan))

    def claim(
        self,
        schedule: Schedule,
        period: str,
        fire_at: datetime | None,
        *,
        late: bool = False,
        rescan: bool = False,
    ) -> FanOutResult:
        """Claim the period's run (`claimed` False: another owner has it); `fan` continues."""
        result = FanOutResult(schedule.name, period, False, late=late, fire_at=fire_at)
        claim = ScheduleRunClaim(
            schedule.name, period, fire_at, self.owner, schedule.lease, late, rescan
        )
        result.claimed = self.store.schedule_run_claim(claim)
        return result

    def fan(self, schedule: Schedule, result: FanOutResult) -> FanOutResult:
        """Enqueue the claimed run's eligible set, batch by batch, and finish the run (a result
        not claimed: nothing to do)."""
        if not result.claimed:
            return result
        period, late, fire_at = result.period, result.late, result.fire_at
        connection = self._reader()
        try:
            ctx = ScheduleContext(schedule.name, period, fire_at, connection, self.store.dialect)
            run = ScheduleRunRef(schedule.name, period, self.owner, schedule.lease)
            for batch in _batches(schedule.eligible(ctx), schedule.batch_size):
                enqueued = enqueue_many(self.runtime, schedule.task, batch, schedule_run=run)
                result.eligible += len(batch)
                result.enqueued += enqueued.created
                points.reach("scheduler.between_batches")
                if not enqueued.run_held:
                    log.warning(
                        "schedule %s %s: the run was taken over; stopping this fan-out",
                        schedule.name,
                        period,
                    )
                    return result
        finally:
            connection.close()
        self.store.schedule_run_finish(schedule.name, period, self.owner, result.eligible, 0)
        log.info(
            "schedule %s %s: %d eligible, %d enqueued%s",
            schedule.name,
            period,
            result.eligible,
            result.enqueued,
            " (late)" if late else "",
        )
        return result

    def _reader(self) -> Any:
        """A connection for the eligible-set query, in a read transaction of its own (on
        PostgreSQL a server-side cursor — `ctx.connection.cursor(name=...)` — streams the set)."""
        connect = getattr(self.store, "connect")  # noqa: B009 (both stores have one)
        return connect()


def run_schedule(runtime: Runtime, schedule: Schedule, period: str, owner: str) -> FanOutResult:
    """A manual re-run of one period (see the module docstring). The period is checked in full
    — its kind's rules, then as a key segment — before the run is claimed: a period refused
    after the claim would leave the run `running` until its lease ran out."""
    schedule.period.check(period)
    problem = key_problem(period)
    if problem is not None or "/" in period:
        raise InvalidArguments(
            f"period {period[:60]!r} of schedule {schedule.name!r} cannot be part of a key: "
            f"{problem or 'it contains /'}"
        )
    result = FanOut(runtime, owner).run(schedule, period, None, rescan=True)
    if not result.claimed:
        raise InvalidState(
            f"schedule {schedule.name!r} period {period}: a fan-out is running now; try again "
            "when it has finished"
        )
    return result
