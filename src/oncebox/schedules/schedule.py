"""Schedules: at a cron time in a timezone, fan out one compact job per eligible subject, for
*that* period.

    @box.schedule("weekly-digest", cron="0 9 * * MON", tz="Europe/Berlin",
                  period=oncebox.jobs.periods.iso_week, task="weekly_digest")
    def active_customers(ctx: ScheduleContext) -> Iterable[dict]:
        for (customer_id,) in ctx.connection.execute("SELECT id FROM customers WHERE active"):
            yield {"customer_id": customer_id, "period": ctx.period}

**Once per period, however many schedulers run.** Each (schedule, period) fan-out is a row in
`oncebox_schedule_runs` with an owner and a lease: a second scheduler finds it taken; if the
owner dies, its lease runs out and the next scheduler — or trigger (`trigger.py`) — takes the run
over before applying any catch-up policy, so a period interrupted half-way is finished even after
later fires. An owner renews its run while it fans out, so one that stopped is seen gone before
its lease ends, and an operator can take its run over at once (`owners.py`). Fan-out is
idempotent — jobs are enqueued by key, and a key that has an intent or an active job is skipped —
so resuming an interrupted fan-out is simply running it again; the eligible-set callable needs no
cursor.

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from cronsim import CronSim, CronSimError

from oncebox.jobs.periods import PeriodKind, aware, zone
from oncebox.jobs.tasks import check_name
from oncebox.kernel.errors import ConfigurationError
from oncebox.schedules.slo import Slo

if TYPE_CHECKING:
    pass

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
    slo: Slo | None = None  # the delivery-window promise (`oncebox.schedules.slo`)

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

    def latest_fire(self, until: datetime) -> datetime:
        """The last fire time at or before `until` (timezone-aware), in UTC."""
        start = aware(until, _TIMES).astimezone(zone(self.tz)) + timedelta(seconds=1)
        return next(iter(CronSim(self.cron, start, reverse=True))).astimezone(UTC)

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
    slo: Slo | None = None,
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
            f"schedule {name!r}: period must be oncebox.jobs.periods.iso_week, day, month or "
            "periods.custom(...)"
        )
    if not 1 <= batch_size <= 100_000:
        raise ConfigurationError(f"schedule {name!r}: batch_size must be within 1..100000")
    if slo is not None and not isinstance(slo, Slo):
        raise ConfigurationError(
            f"schedule {name!r}: slo must be oncebox.Slo(deliver_within=..., target=...)"
        )
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
        slo=slo,
    )
