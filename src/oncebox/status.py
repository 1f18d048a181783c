"""What `oncebox status`, its exporter and the console show: one definition of the numbers.

Read from the depths, the counters and index probes (whatever the backlog), and from each
schedule's period figures. The CLI prints it, `oncebox metrics` exports it and the console
renders it; none of them computes a figure of its own.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from oncebox import shapes
from oncebox.box import Box
from oncebox.deliveries.events import report_figures
from oncebox.jobs.declarations import quiet_limits
from oncebox.kernel.clock import monotonic
from oncebox.kernel.counters import complete
from oncebox.kernel.errors import OnceboxError
from oncebox.lanes.pruner import plan_for
from oncebox.lanes.worker import LIVE_WITHIN
from oncebox.limits.waiting import held_back
from oncebox.retention.held import held
from oncebox.schedules.owners import judge
from oncebox.schedules.slo import Slo

JOB_STATES = ["ready", "leased", "relayed", "done", "dead", "cancelled"]
OUTBOX_STATES = ["pending", "leased", "sending", "sent", "dead", "ambiguous", "discarded"]


def schedule_figures(box: Box, periods: int, now: datetime) -> list[dict[str, Any]]:
    """Each schedule's latest `periods` periods, their figures and SLO judged at `now`."""
    store = box.store
    schedules = []
    slos = store.schedule_slo_list()
    for name, paused, last in store.schedule_state_list():
        window, target = slos.get(name, (None, None))
        slo = None if window is None or target is None else Slo(window, target)
        stats = store.schedule_period_stats(name, periods, window)
        schedules.append(
            {
                "name": name,
                "paused": paused,
                "last_fire_at": shapes.instant(last),
                "slo": None if slo is None else shapes.slo(slo),
                "periods": [
                    shapes.period(
                        p, None if slo is None else slo.assess(p, now), schedule=name, now=now
                    )
                    for p in stats
                ],
            }
        )
    return schedules


def status_data(
    box: Box, periods: int, schedules: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """What `oncebox status --json` prints and the exporter exports. The schedules' period
    figures read every job and message of their periods, so the exporter passes the ones it
    recomputes in the background (`PeriodFigures`, below); everything else is read
    from the depths, the counters and index probes, whatever the backlog."""
    store = box.store
    times = store.status_times()
    jobs, outbox = store.job_count_by_state(), store.outbox_count_by_state()
    every = complete(store.counter_list())
    counters = {name: value for name, value in every.items() if ":" not in name}
    schema = store.schema_status()
    now = times.now
    backlog, workers = store.backlog_list(), store.worker_list(LIVE_WITHIN)
    served = {task for worker in workers if worker.live for task in worker.tasks}
    unserved_tasks = [
        {"task": row.name, "waiting": row.waiting}
        for row in backlog
        if row.kind == "job" and row.waiting and row.name not in served
    ]
    if schedules is None:
        schedules = schedule_figures(box, periods, now)
    fan_outs = [
        shapes.fan_out(run.schedule, run.period, owner)
        for run in store.schedule_run_running()
        if (owner := judge(run, now)) is not None
    ]
    retention = [shapes.held(row, now) for row in held(store, plan_for(box.runtime))]
    limits = [
        shapes.limit(row, now)
        for row in held_back(store.job_limited_waiting, box.registry.limit_plan())
    ]
    declared = store.limit_declaration_list()
    quiet = [shapes.quiet_limit(e) for e in quiet_limits(declared, store.job_limited_waiting, now)]

    def seconds_since(at: datetime | None) -> float | None:
        return None if at is None else round(max(timedelta(0), now - at).total_seconds(), 3)

    return {
        "database": box.where,
        "schema_version": schema.current,
        "now": shapes.instant(now),
        "clock": shapes.clock_shape(store.clock_get(), now),
        "jobs": {state: jobs[state] for state in JOB_STATES},
        "claim_conflicts": counters["claim_conflicts"],
        "enqueue_duplicates": counters["enqueue_duplicates"],
        "counters": counters,
        "oldest_due_ready_age_s": seconds_since(times.oldest_due_ready),
        "next_ready_at": shapes.instant(times.next_ready),
        "outbox": {state: outbox[state] for state in OUTBOX_STATES},
        "oldest_pending_message_age_s": seconds_since(times.oldest_pending_message),
        "past_lease": {"jobs": times.jobs_past_lease, "messages": times.messages_past_lease},
        "dead": jobs["dead"] + outbox["dead"],
        "ambiguous": outbox["ambiguous"],
        "reports": report_figures(every),
        "backlog": [shapes.backlog(row) for row in backlog],
        "unserved_tasks": unserved_tasks,
        "workers_live": sum(1 for worker in workers if worker.live),
        "schedules": schedules,
        "fan_outs": fan_outs,
        "retention": retention,
        "limits": limits,
        "quiet_limits": quiet,
    }


PERIODS = 3  # recent periods per schedule, as `status` shows by default
REFRESH_EVERY = 30.0  # seconds: the period figures' shortest refresh interval
REFRESH_SHARE = 0.1  # ... lengthened so that refreshing takes at most this share of the time
RECOMPUTE_ON_READ_WITHIN = 0.25  # seconds: figures this quick are recomputed by a page's read

log = logging.getLogger("oncebox.status")


def store_depths(box: Box) -> tuple[int, ...]:
    """The jobs and messages per state, from the depths the triggers keep (a cheap read). Any
    job or message that changes state changes them: period figures read with other depths may
    be out of date."""
    jobs, outbox = box.store.job_count_by_state(), box.store.outbox_count_by_state()
    return tuple(jobs[s] for s in JOB_STATES) + tuple(outbox[s] for s in OUTBOX_STATES)


@dataclass(frozen=True)
class Figures:
    schedules: list[dict[str, Any]]
    at: float  # monotonic instant they were read
    took: float  # seconds the reading took
    depths: tuple[int, ...] = ()  # the store's depths just before (`store_depths`)


class PeriodFigures:
    """The schedules' period figures, recomputed by `run` in the background and read by the
    scrape (`latest`). A refresh that fails (the store is away) keeps the last figures, whose
    age then shows it; the scrape itself still fails on its own reads, as it should."""

    def __init__(self, box: Box, periods: int = PERIODS) -> None:
        self.box = box
        self.periods = periods
        self._latest: Figures | None = None
        self._lock = threading.Lock()
        self._recomputing = threading.Lock()

    def refresh(self) -> Figures:
        started = monotonic()
        depths = store_depths(self.box)
        schedules = schedule_figures(self.box, self.periods, self.box.store.clock_now())
        figures = Figures(schedules, started, monotonic() - started, depths)
        with self._lock:
            self._latest = figures
        return figures

    def latest(self) -> Figures:
        with self._lock:
            latest = self._latest
        return latest if latest is not None else self.refresh()

    def agreeing(self, depths: tuple[int, ...]) -> Figures:
        """Figures read with `depths` (what a page has just read, `store_depths`), so that a
        page's tiles and its period figures tell of the same moment — a replay shows in both at
        once. Recomputed here, by the page's read, when jobs or messages moved since the kept
        ones were read and reading them took at most `RECOMPUTE_ON_READ_WITHIN`; pages read at
        once share one recomputation. Costlier figures are left to the background (`run`):
        the page gets the kept ones, whose `depths` then differ, and says how old they are."""
        latest = self.latest()
        if latest.depths == depths or latest.took > RECOMPUTE_ON_READ_WITHIN:
            return latest
        with self._recomputing:
            latest = self.latest()  # another page may have recomputed them meanwhile
            if latest.depths == depths:
                return latest
            return self.refresh()

    def run(self, stop: threading.Event) -> None:
        took = self.latest().took
        while not stop.wait(max(REFRESH_EVERY, took / REFRESH_SHARE)):
            try:
                took = self.refresh().took
            except OnceboxError as exc:  # the store away, say: the figures' age tells
                log.warning("period figures not refreshed: %s", exc)
