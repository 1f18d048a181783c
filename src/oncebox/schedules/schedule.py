"""Schedules: at a cron time in a timezone, fan out one compact job per eligible subject, for
*that* period.

    @box.schedule("weekly-digest", cron="0 9 * * MON", tz="Europe/Berlin",
                  period=oncebox.periods.iso_week, task="weekly_digest")
    def active_customers(ctx: ScheduleContext) -> Iterable[dict]:
        for (customer_id,) in ctx.connection.execute("SELECT id FROM customers WHERE active"):
            yield {"customer_id": customer_id, "period": ctx.period}

**Once per period, however many schedulers run.** Each (schedule, period) fan-out is a row in
`oncebox_schedule_runs` with an owner and a lease: a second scheduler finds it taken; if the
owner dies, its lease runs out and the next scheduler takes the run over. Fan-out is idempotent —
jobs are enqueued by key, and a key that has an intent or an active job is skipped — so resuming
an interrupted fan-out is simply running it again; the eligible-set callable needs no cursor.

**Periods come from the fire time**, in the schedule's timezone (`periods.py`). Cron times are
computed with cronsim: a time that does not exist on a spring-forward day fires once, at the
first valid instant after it (02:30 → 03:00); a time that exists twice on a fall-back day fires
once, at its first occurrence.

**Catch-up after downtime** (`catch_up=`): `latest` (default) fans out only the most recent missed
period; `all` every missed period within `catch_up_window`, oldest first; `none` only fires that
are on time (within `grace` of now). Late fan-outs are marked `late`.

**Overlap** (`overlap=`), when a period's fan-out is still running as the next is due: `wait`
(default; the next starts once the previous is done), `skip` (the next period is not fanned out),
`parallel` (both run).

**Pausing** skips the fires that pass while paused; resuming starts from now.

**Manual re-run**: `box.run_schedule(name, period)` scans eligibility again and enqueues only keys
with no intent and no active job — a customer added since gets their digest; nobody gets two.
Each complete scan records its eligible count: the latest is the period's coverage denominator.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal

from cronsim import CronSim, CronSimError

from oncebox import points
from oncebox.errors import ConfigurationError, InvalidArguments, InvalidState, KeyDrift
from oncebox.jobs.keys import key_problem
from oncebox.jobs.periods import PeriodKind, aware, zone
from oncebox.jobs.tasks import check_name
from oncebox.lanes.loop import run_forever
from oncebox.store.base import ScheduleRunClaim, ScheduleRunRef, Store

if TYPE_CHECKING:
    from oncebox.box import Box

log = logging.getLogger("oncebox.schedule")
CatchUp = Literal["latest", "all", "none"]
Overlap = Literal["wait", "skip", "parallel"]
_TIMES = "fire times are computed from"  # the start of the error for a naive instant


@dataclass(frozen=True)
class ScheduleContext:
    """What the eligible-set callable receives: the period, the fire time, a connection to read
    the user's tables with (the store's database), and the dialect it speaks."""

    schedule: str
    period: str
    fire_at: datetime | None
    connection: Any
    dialect: str


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    tz: str
    period: PeriodKind
    task: str
    eligible: Callable[[ScheduleContext], Iterable[Mapping[str, Any]]]
    catch_up: CatchUp = "latest"
    catch_up_window: timedelta = timedelta(days=31)
    overlap: Overlap = "wait"
    grace: timedelta = timedelta(minutes=10)
    batch_size: int = 5000
    lease: timedelta = timedelta(minutes=5)

    def fires_between(self, after: datetime, until: datetime) -> list[datetime]:
        """Fire times in (after, until], in UTC; at most ~10 000 (a runaway is a config bug).
        Both instants must be timezone-aware (a naive one is refused, never read as local)."""
        where = zone(self.tz)
        aware(until, _TIMES)
        fires: list[datetime] = []
        for fire in CronSim(self.cron, aware(after, _TIMES).astimezone(where)):
            if fire > until:
                break
            fires.append(fire.astimezone(until.tzinfo))
            if len(fires) > 10_000:
                break
        return fires

    def next_fire(self, after: datetime) -> datetime:
        """The first fire time after `after` (timezone-aware), in UTC."""
        start = aware(after, _TIMES).astimezone(zone(self.tz))
        return next(iter(CronSim(self.cron, start))).astimezone(UTC)

    def period_of(self, fire: datetime) -> str:
        """The period of a (timezone-aware) fire time, in the schedule's timezone."""
        return self.period(aware(fire).astimezone(zone(self.tz)))


def make_schedule(
    name: str,
    *,
    cron: str,
    tz: str,
    period: PeriodKind,
    task: str,
    eligible: Callable[[ScheduleContext], Iterable[Mapping[str, Any]]],
    catch_up: CatchUp = "latest",
    catch_up_window: timedelta = timedelta(days=31),
    overlap: Overlap = "wait",
    grace: timedelta = timedelta(minutes=10),
    batch_size: int = 5000,
) -> Schedule:
    check_name("schedule", name)
    zone(tz)
    try:
        CronSim(cron, datetime(2026, 1, 1, tzinfo=zone(tz)))
    except (CronSimError, ValueError) as exc:
        raise ConfigurationError(f"schedule {name!r}: cron {cron!r} is invalid: {exc}") from None
    if catch_up not in ("latest", "all", "none"):
        raise ConfigurationError(f"schedule {name!r}: catch_up must be latest, all or none")
    if overlap not in ("wait", "skip", "parallel"):
        raise ConfigurationError(f"schedule {name!r}: overlap must be wait, skip or parallel")
    if not isinstance(period, PeriodKind):
        raise ConfigurationError(
            f"schedule {name!r}: period must be oncebox.periods.iso_week, day, month or "
            "periods.custom(...)"
        )
    if not 1 <= batch_size <= 100_000:
        raise ConfigurationError(f"schedule {name!r}: batch_size must be within 1..100000")
    return Schedule(
        name,
        cron,
        tz,
        period,
        task,
        eligible,
        catch_up,
        catch_up_window,
        overlap,
        grace,
        batch_size,
    )


@dataclass
class FanOutResult:
    schedule: str
    period: str
    claimed: bool
    eligible: int = 0
    enqueued: int = 0
    late: bool = False


@dataclass
class TickerResult:
    fan_outs: list[FanOutResult] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # drifted keys (see oncebox.keyguard)


def _batches(rows: Iterable[Mapping[str, Any]], size: int) -> Iterator[list[Mapping[str, Any]]]:
    iterator = iter(rows)
    while batch := list(islice(iterator, size)):
        yield batch


class FanOut:
    """One period's fan-out: claim the run, stream the eligible set, enqueue in batches."""

    def __init__(self, box: Box, owner: str) -> None:
        self.box = box
        self.store: Store = box.store
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
        result = FanOutResult(schedule.name, period, False, late=late)
        claim = ScheduleRunClaim(
            schedule.name, period, fire_at, self.owner, schedule.lease, late, rescan
        )
        if not self.store.schedule_run_claim(claim):
            return result
        result.claimed = True
        connection = self._reader()
        try:
            ctx = ScheduleContext(schedule.name, period, fire_at, connection, self.store.dialect)
            run = ScheduleRunRef(schedule.name, period, self.owner, schedule.lease)
            for batch in _batches(schedule.eligible(ctx), schedule.batch_size):
                enqueued = self.box.enqueue_many(schedule.task, batch, schedule_run=run)
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


class ScheduleTicker:
    """The scheduler lane: fans out due periods of every schedule of a box."""

    def __init__(
        self,
        box: Box,
        schedules: Mapping[str, Schedule],
        owner: str,
        interval: timedelta = timedelta(seconds=15),
    ) -> None:
        self.box = box
        self.store = box.store
        self.schedules = dict(schedules)
        self.fan_out = FanOut(box, owner)
        self.interval = interval

    def run_once(self) -> TickerResult:
        result = TickerResult()
        for schedule in self.schedules.values():
            self._tick(schedule, result)
        return result

    def _tick(self, schedule: Schedule, result: TickerResult) -> None:
        state = self.store.schedule_state(schedule.name, schedule.grace)
        if state.paused or state.last_fire_at is None:
            return
        fires = schedule.fires_between(state.last_fire_at, state.now)
        if not fires:
            return
        try:  # a drifted schedule keeps its fires due, for after `oncebox keys accept`
            self.box.key_guard.require_schedule(schedule)
            self.box.key_guard.require_task(self.box.registry.resolve(schedule.task))
        except KeyDrift as refused:
            self.box.key_guard.report(refused)
            result.refused.append(schedule.name)
            return
        due = self._due(schedule, fires, state.now, result)
        for fire in due:
            period = schedule.period_of(fire)
            if schedule.overlap != "parallel":
                busy = self.store.schedule_run_busy(schedule.name, period)
                if busy is not None and schedule.overlap == "wait":
                    return  # try again next tick; last_fire_at stays put
                if busy is not None:
                    result.skipped.append((schedule.name, period))
                    self.store.schedule_state_advance(schedule.name, fire)
                    continue
            late = state.now - fire > schedule.grace
            outcome = self.fan_out.run(schedule, period, fire, late=late)
            result.fan_outs.append(outcome)
            if not outcome.claimed:
                return  # another scheduler has this period; it advances the schedule
            self.store.schedule_state_advance(schedule.name, fire)
        self.store.schedule_state_advance(schedule.name, fires[-1])

    def _due(
        self, schedule: Schedule, fires: list[datetime], now: datetime, result: TickerResult
    ) -> list[datetime]:
        on_time = [fire for fire in fires if now - fire <= schedule.grace]
        if schedule.catch_up == "none":
            due = on_time[-1:]
        elif schedule.catch_up == "latest":
            due = fires[-1:]
        else:
            due = [fire for fire in fires if now - fire <= schedule.catch_up_window]
        for fire in fires:
            if fire not in due:
                result.skipped.append((schedule.name, schedule.period_of(fire)))
        return due

    def run_forever(self, stop: threading.Event) -> None:
        run_forever(
            "scheduler", lambda: bool(self.run_once().fan_outs), stop, self.interval.total_seconds()
        )


def run_schedule(box: Box, schedule: Schedule, period: str, owner: str) -> FanOutResult:
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
    result = FanOut(box, owner).run(schedule, period, None, rescan=True)
    if not result.claimed:
        raise InvalidState(
            f"schedule {schedule.name!r} period {period}: a fan-out is running now; try again "
            "when it has finished"
        )
    return result
