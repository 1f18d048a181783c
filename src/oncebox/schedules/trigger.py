"""A schedule fired from outside: an external cron's trigger (a hosted scheduler, a CI job, a
systemd timer) as the start of a period's fan-out.

The caller says only *which* schedule; the server decides *which period*, from its own clock and
the schedule's own cron and period function — no caller computes ISO weeks or time zones. It
takes the latest fire at or before its clock, or one due within `tolerance` (a trigger that
arrives a little early fires the period it was meant for, not the one before), and fans that
period out through the same claim as the built-in ticker: repeated, overlapping or concurrent
triggers, and the ticker itself, fan a period out once. The schedule's state is advanced to the
fire, so a ticker running beside the trigger does not try that fire again.

Refused, before anything is written: an unknown schedule (`NotFound`), a paused one
(`InvalidState`), one whose previous period is still fanning out unless its overlap is
`parallel` (`InvalidState`: the caller tries again, as the ticker would wait), a drifted key
template or period function (`KeyDrift`). `fire` runs the fan-out in the call, as `run_schedule`
does; an HTTP trigger answers once the run is claimed (`claim`) and fans out after (`proceed`):
a server that dies midway leaves a run whose lease runs out; the next trigger, or a ticker,
claims it then and resumes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from oncebox.errors import InvalidState
from oncebox.runtime import Runtime
from oncebox.schedules.fanout import FanOut, FanOutResult
from oncebox.schedules.schedule import Schedule

TOLERANCE = timedelta(minutes=1)  # how early a trigger may arrive and still fire its period


@dataclass(frozen=True)
class Fired:
    """What a trigger did: the period it chose and why, and the fan-out (`claimed` False: the
    period's run was already claimed — by the ticker, or an earlier trigger)."""

    schedule: str
    period: str
    fire_at: datetime
    now: datetime
    fan_out: FanOutResult

    @property
    def claimed(self) -> bool:
        return self.fan_out.claimed


class ScheduleTrigger:
    """Fires a runtime's schedules on request (`fire`)."""

    def __init__(self, runtime: Runtime, owner: str, tolerance: timedelta = TOLERANCE) -> None:
        if tolerance < timedelta(0):
            raise ValueError("a trigger's tolerance cannot be negative")
        self.runtime = runtime
        self.fan_out = FanOut(runtime, owner)
        self.tolerance = tolerance

    def fire(self, schedule: Schedule) -> Fired:
        """Claim the period's run and fan it out, in the call."""
        return self.proceed(schedule, self.claim(schedule))

    def claim(self, schedule: Schedule) -> Fired:
        """Choose the period and claim its run (`claimed` False: already claimed); the
        schedule's state is advanced to the fire either way. Nothing is enqueued yet."""
        store = self.runtime.store
        state = store.schedule_state(schedule.name, schedule.grace)
        if state.paused:
            raise InvalidState(
                f"schedule {schedule.name!r} is paused: resume it (oncebox schedule resume) "
                "before firing it"
            )
        self.runtime.key_guard.require_schedule(schedule)
        self.runtime.key_guard.require_task(self.runtime.registry.resolve(schedule.task))
        fire_at = schedule.latest_fire(state.now + self.tolerance)
        period = schedule.period_of(fire_at)
        if schedule.overlap != "parallel":  # the schedule's overlap policy, as the ticker's
            busy = store.schedule_run_busy(schedule.name, period)
            if busy is not None:
                raise InvalidState(
                    f"schedule {schedule.name!r}: period {busy} is still fanning out "
                    f"(overlap={schedule.overlap!r}); {period} was not fired — try again later"
                )
        late = state.now - fire_at > schedule.grace
        outcome = self.fan_out.claim(schedule, period, fire_at, late=late)
        store.schedule_state_advance(schedule.name, fire_at)
        return Fired(schedule.name, period, fire_at, state.now, outcome)

    def proceed(self, schedule: Schedule, fired: Fired) -> Fired:
        """Fan out a claimed run (one not claimed: nothing to do)."""
        self.fan_out.fan(schedule, fired.fan_out)
        return fired
