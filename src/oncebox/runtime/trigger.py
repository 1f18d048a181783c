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
does; an HTTP trigger answers once the run is claimed (`claim`) and fans out after (`proceed`).
A server that dies midway leaves a run whose lease runs out, and where no ticker runs (a
cron-only deployment) nothing else would finish it: so every trigger first claims this
schedule's stalled runs — with the ticker's claim, fenced on the lease having run out, so one
trigger or ticker takes each — and fans them out, oldest first, before the latest period.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from oncebox.kernel.errors import InvalidState
from oncebox.runtime.fanout import FanOut, FanOutResult
from oncebox.runtime.runtime import Runtime
from oncebox.schedules.owners import renewing
from oncebox.schedules.schedule import Schedule
from oncebox.store.records import ScheduleRunRow

TOLERANCE = timedelta(minutes=1)  # how early a trigger may arrive and still fire its period


@dataclass(frozen=True)
class Fired:
    """What a trigger did: the period it chose and why, and the fan-out (`claimed` False: the
    period's run was already claimed — by the ticker, or an earlier trigger); `resumed`: the
    stalled runs it claimed, fanned out first (the chosen period among them when its own run
    had stalled)."""

    schedule: str
    period: str
    fire_at: datetime
    now: datetime
    fan_out: FanOutResult
    resumed: tuple[FanOutResult, ...] = ()

    @property
    def claimed(self) -> bool:
        return self.fan_out.claimed

    @property
    def proceeds(self) -> bool:
        """Whether `proceed` has anything to fan out."""
        return self.claimed or bool(self.resumed)


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
        stalled = self._stalled(schedule)
        if schedule.overlap != "parallel":  # the schedule's overlap policy, as the ticker's
            busy = store.schedule_run_busy(schedule.name, period)  # (a stalled run is not)
            if busy is not None:
                raise InvalidState(
                    f"schedule {schedule.name!r}: period {busy} is still fanning out "
                    f"(overlap={schedule.overlap!r}); {period} was not fired — try again later"
                )
        # the ticker's claim: only while the lease has run out, so each is resumed by one
        claims = [
            self.fan_out.claim(schedule, run.period, run.fire_at, late=True) for run in stalled
        ]
        resumed = tuple(claim for claim in claims if claim.claimed)
        outcome = next((claim for claim in resumed if claim.period == period), None)
        if outcome is None:
            late = state.now - fire_at > schedule.grace
            outcome = self.fan_out.claim(schedule, period, fire_at, late=late)
        store.schedule_state_advance(schedule.name, fire_at)
        return Fired(schedule.name, period, fire_at, state.now, outcome, resumed)

    def _stalled(self, schedule: Schedule) -> list[ScheduleRunRow]:
        """This schedule's runs whose owner's lease ran out, oldest first."""
        return self.runtime.store.schedule_run_stalled(schedule.name)

    def proceed(self, schedule: Schedule, fired: Fired) -> Fired:
        """Fan out the resumed runs, oldest first, then the period's own (one not claimed:
        nothing to do). The runs waiting their turn are this trigger's too: each is renewed
        until its fan-out starts (which renews it from then on), so no one judges its owner
        gone — nor takes it over, nor resumes it beside this one — while an earlier run fans
        out."""
        runs = list(fired.resumed)
        if not any(run is fired.fan_out for run in runs):
            runs.append(fired.fan_out)
        queued = [run for run in runs if run.claimed]
        waiting: dict[int, contextlib.ExitStack] = {}
        try:
            for run in queued:
                waiting[id(run)] = stack = contextlib.ExitStack()
                stack.enter_context(
                    renewing(self.runtime.store, schedule.name, run.period, self.fan_out.owner)
                )
            for run in runs:
                if id(run) in waiting:
                    waiting.pop(id(run)).close()
                self.fan_out.fan(schedule, run)
        finally:
            for stack in waiting.values():
                stack.close()
        return fired
