"""`ScheduleTicker`: the scheduler lane — fans out the due periods of every schedule, by its
catch-up and overlap policies (see `schedule.py`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from oncebox.kernel.errors import KeyDrift
from oncebox.lanes.lane import configured, run_forever
from oncebox.runtime.fanout import FanOut, FanOutResult
from oncebox.runtime.runtime import Runtime
from oncebox.schedules.schedule import Schedule


@dataclass(frozen=True)
class TickerConfig:
    interval: timedelta = timedelta(seconds=15)


@dataclass
class TickerResult:
    fan_outs: list[FanOutResult] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # drifted keys (see oncebox.jobs.keyguard)


class ScheduleTicker:
    """The scheduler lane: fans out due periods of every schedule of a runtime."""

    def __init__(
        self,
        runtime: Runtime,
        schedules: Mapping[str, Schedule],
        owner: str,
        interval: timedelta | None = None,
        *,
        config: TickerConfig | None = None,
    ) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.schedules = dict(schedules)
        self.fan_out = FanOut(runtime, owner)
        self.config = configured(config, TickerConfig, interval=interval)
        self.interval = self.config.interval
        self._slo_recorded: set[str] = set()  # once per schedule and process

    def run_once(self) -> TickerResult:
        result = TickerResult()
        for schedule in self.schedules.values():
            self._tick(schedule, result)
        return result

    def _tick(self, schedule: Schedule, result: TickerResult) -> None:
        state = self.store.schedule_state(schedule.name, schedule.grace)
        if schedule.name not in self._slo_recorded:  # what `status` judges the periods by
            slo = schedule.slo
            self.store.schedule_slo_set(
                schedule.name,
                None if slo is None else slo.deliver_within,
                None if slo is None else slo.target,
            )
            self._slo_recorded.add(schedule.name)
        if state.paused or state.last_fire_at is None:
            return
        stalled = self.store.schedule_run_stalled(schedule.name)
        fires = schedule.fires_between(state.last_fire_at, state.now)
        if not fires and not stalled:
            return
        try:  # a drifted schedule keeps its fires due, for after `oncebox keys accept`
            self.runtime.key_guard.require_schedule(schedule)
            self.runtime.key_guard.require_task(self.runtime.registry.resolve(schedule.task))
        except KeyDrift as refused:
            self.runtime.key_guard.report(refused)
            result.refused.append(schedule.name)
            return
        # A fan-out interrupted half-way (its owner died) is resumed first, whatever the
        # catch-up policy: the policy decides which *missed fires* to fan out, and this period
        # was not missed — it is owed the rest of its eligible set.
        resumed = set()
        for run in stalled:
            result.fan_outs.append(self.fan_out.run(schedule, run.period, run.fire_at, late=True))
            resumed.add(run.period)
        if not fires:
            return
        due = [
            fire
            for fire in self._due(schedule, fires, state.now, result)
            if schedule.period_of(fire) not in resumed
        ]
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
