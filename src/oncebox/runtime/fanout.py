"""One period's fan-out: claim the run, stream the eligible set, enqueue it in batches — a
manual re-run of a period (see `schedule.py` for the rules both follow), and an operator's
take-over of a run whose owner is gone (`owners.py`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from oncebox.jobs.keys import key_problem
from oncebox.kernel import points
from oncebox.kernel.errors import InvalidArguments, InvalidState
from oncebox.runtime.enqueue import enqueue_many
from oncebox.runtime.runtime import Runtime
from oncebox.schedules.owners import RunOwner, judge, renewing
from oncebox.schedules.schedule import Schedule, ScheduleContext
from oncebox.store.params import ScheduleRunRef
from oncebox.store.protocol import Store
from oncebox.store.records import ScheduleRunClaim, ScheduleRunTakeOver

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
        period, late = result.period, result.late
        connection = self._reader()
        try:
            with renewing(self.store, schedule.name, period, self.owner):
                if not self._enqueue(schedule, result, connection):
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

    def _enqueue(self, schedule: Schedule, result: FanOutResult, connection: Any) -> bool:
        """Stream the eligible set into jobs, batch by batch; False once the run was taken
        over (its next batch is not this owner's to enqueue)."""
        period, fire_at = result.period, result.fire_at
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
                return False
        return True

    def _reader(self) -> Any:
        """A connection for the eligible-set query, in a read transaction of its own (on
        PostgreSQL a server-side cursor — `ctx.connection.cursor(name=...)` — streams the set)."""
        connect = getattr(self.store, "connect")  # noqa: B009 (both stores have one)
        return connect()


def _check_period(schedule: Schedule, period: str) -> None:
    """The period checked in full — its kind's rules, then as a key segment — before the run is
    claimed: a period refused after the claim would leave the run `running` until its lease ran
    out."""
    schedule.period.check(period)
    problem = key_problem(period)
    if problem is not None or "/" in period:
        raise InvalidArguments(
            f"period {period[:60]!r} of schedule {schedule.name!r} cannot be part of a key: "
            f"{problem or 'it contains /'}"
        )


def run_schedule(runtime: Runtime, schedule: Schedule, period: str, owner: str) -> FanOutResult:
    """A manual re-run of one period (see the module docstring)."""
    _check_period(schedule, period)
    result = FanOut(runtime, owner).run(schedule, period, None, rescan=True)
    if not result.claimed:
        held = runtime.store.schedule_run_get(schedule.name, period)
        judged = None if held is None else judge(held, runtime.store.clock_now())
        hint = ""
        if judged is not None and judged.gone:
            hint = (
                f"; its owner {judged.owner} is gone — take it over at once with --take-over "
                "--reason ..."
            )
        raise InvalidState(
            f"schedule {schedule.name!r} period {period}: a fan-out is running now; try again "
            f"when it has finished{hint}"
        )
    return result


@dataclass(frozen=True)
class TakenOver:
    """A take-over that happened: whose run it was (as judged), its audit row, and the fan-out
    the new owner then ran."""

    previous: RunOwner
    audit_id: int
    fan_out: FanOutResult


def take_over(
    runtime: Runtime, schedule: Schedule, period: str, owner: str, *, actor: str, reason: str
) -> TakenOver:
    """An operator takes the period's running fan-out from an owner that is gone (`owners.py`)
    and fans it out at once, audited — without waiting out the lease. Refused, with nothing
    written: a period with no running fan-out, a live owner's run, and a run that changed
    between the read and the write (its owner renewed, extended or finished meanwhile: the
    write is fenced on the owner, lease and renewal it read)."""
    _check_period(schedule, period)
    store = runtime.store
    run = store.schedule_run_get(schedule.name, period)
    judged = None if run is None or run.state != "running" else judge(run, store.clock_now())
    if run is None or judged is None:
        raise InvalidState(
            f"schedule {schedule.name!r}: no fan-out of {period} is running, so there is nothing "
            "to take over; run it without --take-over"
        )
    if not judged.gone:
        raise InvalidState(
            f"schedule {schedule.name!r} period {period}: its owner {judged.owner} is alive "
            f"(renewed {_ago(judged)}); a take-over is for an owner that is gone — its lease "
            f"ends at {judged.lease_ends_at.isoformat().replace('+00:00', 'Z')}"
        )
    points.reach("schedule.take_over_before_write")
    take = ScheduleRunTakeOver(
        schedule.name,
        period,
        owner,
        schedule.lease,
        seen_owner=judged.owner,
        seen_lease_expires_at=judged.lease_ends_at,
        seen_renewed_at=run.renewed_at,
        actor=actor,
        reason=reason,
    )
    audit_id = store.schedule_run_take_over(take)
    if audit_id is None:
        raise InvalidState(
            f"schedule {schedule.name!r} period {period}: its run changed after it was read "
            f"(owner {judged.owner} renewed, extended or finished it, or another took it); "
            "nothing was taken over — look again (oncebox status)"
        )
    result = FanOutResult(schedule.name, period, True, late=run.late, fire_at=run.fire_at)
    FanOut(runtime, owner).fan(schedule, result)
    return TakenOver(judged, audit_id, result)


def _ago(judged: RunOwner) -> str:
    if judged.renewed_at is None:
        return "never: judged by its lease"
    return f"{int((judged.now - judged.renewed_at).total_seconds())}s ago"
