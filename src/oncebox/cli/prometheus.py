"""The figures of `oncebox status`, as Prometheus metrics: one collector that reads the store on
each scrape (`status_data`, the same function `status` prints from), so a scrape, `status` and
the console never disagree. Store-wide series come from this one exporter (`oncebox metrics`);
running it beside every worker would make `sum()` count each figure once per copy. A worker's
own `--metrics-bind` serves `ProcessCollector`: that process's figures only (its store
operations' calls, errors and time, its leases lost), which do sum across workers.

The schedules' period figures are the exception to "read on each scrape": they read every job
and message of their periods (a second or more for a 1 000 000-subject Monday), so the exporter
recomputes them in the background (`PeriodFigures`), as often as costs at most a tenth of the
database's time, and a scrape reads the latest — with their age, `oncebox_period_figures_age_
seconds`. Everything else a scrape reads costs a few index probes, whatever the backlog.

Names follow Prometheus conventions: counters end in `_total`, ages in `_seconds`; a label
carries a state, a task, a channel or a schedule's period.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from oncebox import shapes
from oncebox.box import Box
from oncebox.deliveries.events import STAGES
from oncebox.kernel.clock import monotonic
from oncebox.kernel.counters import COUNTERS
from oncebox.kernel.metrics import Metrics
from oncebox.status import PERIODS, PeriodFigures, status_data


class StoreCollector(Collector):
    """Reads the store on every scrape; a scrape that cannot reach it fails (HTTP 500), which
    Prometheus records as `up == 0` — never as figures that silently stopped moving."""

    def __init__(self, box: Box, figures: PeriodFigures | None = None) -> None:
        self.box = box
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        started = monotonic()
        latest = None if self.figures is None else self.figures.latest()
        data = status_data(self.box, PERIODS, None if latest is None else latest.schedules)
        yield from counters(data)
        yield from reports(data)
        yield from gauges(data)
        yield from periods(data)
        yield from retention(data)
        yield from limits(data)
        yield _one(
            "oncebox_period_figures_age_seconds",
            "How old the period figures of this scrape are (refreshed in the background).",
            0.0 if latest is None else monotonic() - latest.at,
        )
        took = GaugeMetricFamily(
            "oncebox_scrape_duration_seconds", "Time this scrape spent reading the store."
        )
        took.add_metric([], monotonic() - started)
        yield took


def counters(data: dict[str, Any]) -> Iterator[Metric]:
    for name, value in data["counters"].items():
        yield CounterMetricFamily(f"oncebox_{name}", COUNTERS.get(name, name), value=value)


def reports(data: dict[str, Any]) -> Iterator[Metric]:
    """What each channel's provider reported (deliveries/): messages per stage, and the rates."""
    stages = CounterMetricFamily(
        "oncebox_provider_reports",
        "Messages a provider's delivery events moved to a stage (reported: any event), per "
        "channel; each message counted once per stage.",
        labels=["channel", "stage"],
    )
    bounce = GaugeMetricFamily(
        "oncebox_bounce_ratio",
        "Bounced among the messages a channel's provider reported on.",
        labels=["channel"],
    )
    complaint = GaugeMetricFamily(
        "oncebox_complaint_ratio",
        "Complained among the messages a channel's provider reported on.",
        labels=["channel"],
    )
    for channel, figures in data["reports"].items():
        for stage in ("reported", *STAGES):
            stages.add_metric([channel, stage], figures[stage])
        if figures["bounce_rate"] is not None:
            bounce.add_metric([channel], figures["bounce_rate"])
            complaint.add_metric([channel], figures["complaint_rate"])
    yield stages
    yield bounce
    yield complaint


def gauges(data: dict[str, Any]) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("oncebox_jobs", "Jobs by state.", labels=["state"])
    for state, count in data["jobs"].items():
        jobs.add_metric([state], count)
    yield jobs
    outbox = GaugeMetricFamily("oncebox_messages", "Outbox messages by state.", labels=["state"])
    for state, count in data["outbox"].items():
        outbox.add_metric([state], count)
    yield outbox
    yield _one(
        "oncebox_oldest_due_job_age_seconds",
        "How long the oldest due ready job has waited (0: none waits).",
        data["oldest_due_ready_age_s"] or 0.0,
    )
    yield _one(
        "oncebox_oldest_pending_message_age_seconds",
        "How long the oldest pending message has waited (0: none).",
        data["oldest_pending_message_age_s"] or 0.0,
    )
    past = GaugeMetricFamily(
        "oncebox_past_lease",
        "Rows whose lease ran out and the rescuer has not yet taken back.",
        labels=["kind"],
    )
    for kind, count in data["past_lease"].items():
        past.add_metric([kind.removesuffix("s")], count)  # "job", "message": as the backlog's
    yield past
    yield from backlog(data)
    yield _one("oncebox_dead_letters", "Dead jobs and dead messages.", data["dead"])
    yield _one("oncebox_ambiguous_messages", "Sends held for a person.", data["ambiguous"])
    yield _one("oncebox_workers_live", "Workers seen recently.", data["workers_live"])
    unserved = GaugeMetricFamily(
        "oncebox_unserved_jobs", "Jobs of a task no live worker serves.", labels=["task"]
    )
    for entry in data["unserved_tasks"]:
        unserved.add_metric([entry["task"]], entry["waiting"])
    yield unserved
    clock = data["clock"]
    yield _one(
        "oncebox_store_clock_simulated",
        "1 while a frozen or offset test clock is in force on the database, else 0.",
        0 if clock["mode"] == "real" else 1,
    )


def backlog(data: dict[str, Any]) -> Iterator[Metric]:
    """The work not finished, per task (kind "job") and per channel (kind "message")."""
    families = _families(
        "oncebox_",
        ["kind", "name"],
        waiting="Jobs ready, or messages pending, per task or channel.",
        held="Jobs or messages under a lease, per task or channel.",
        oldest_due_age_seconds="How long the first due job of a task, or message of a channel, "
        "has been due.",
    )
    now = datetime.fromisoformat(data["now"])
    for row in map(shapes.backlog_row, data["backlog"]):
        key = [row.kind, row.name]
        late = None if row.next_due_at is None else (now - row.next_due_at).total_seconds()
        families["waiting"].add_metric(key, row.waiting)
        families["held"].add_metric(key, row.held)
        families["oldest_due_age_seconds"].add_metric(key, max(0.0, late or 0.0))
    yield from families.values()


def retention(data: dict[str, Any]) -> Iterator[Metric]:
    """What retention holds, per kind of row and task, channel or schedule (`retention/held.py`):
    rows past their retention that the pruner has not taken yet (counted up to 1 000), and the
    age of the oldest row kept."""
    families = _families(
        "oncebox_retention_",
        ["kind", "name"],
        waiting="Rows past their retention, not yet pruned (counted up to 1000).",
        oldest_age_seconds="Age of the oldest row retention keeps, per kind and name.",
    )
    for entry in data["retention"]:
        key = [entry["kind"], entry["name"]]
        families["waiting"].add_metric(key, entry["waiting"])
        families["oldest_age_seconds"].add_metric(key, entry["oldest_age_s"] or 0.0)
    yield from families.values()


def limits(data: dict[str, Any]) -> Iterator[Metric]:
    """What each task limit holds back, as a whole (`limits/waiting.py`): its jobs running, the
    due jobs waiting (counted up to 100 per partition), and the longest wait among them — the
    most starved partition's, for a per-partition limit. Partitions are not labels: a tenant
    per series would grow without bound; `oncebox status` lists them."""
    families = _families(
        "oncebox_limit_",
        ["limit"],
        running="Jobs of the limit's tasks leased now (its slots in use).",
        waiting="Due jobs of the limit's tasks not leased (counted up to 100 per partition).",
        oldest_wait_seconds="How long the oldest due job under the limit has waited.",
    )
    for entry in data["limits"]:
        if entry["partition"] is None:
            key = [entry["limit"]]
            families["running"].add_metric(key, entry["running"])
            families["waiting"].add_metric(key, entry["waiting"])
            families["oldest_wait_seconds"].add_metric(key, entry["oldest_wait_s"] or 0.0)
    yield from families.values()


def periods(data: dict[str, Any]) -> Iterator[Metric]:
    labels = ["schedule", "period"]
    figures = _families(
        "oncebox_period_",
        labels,
        eligible="Subjects the period's latest scan found eligible.",
        enqueued="Jobs the period's fan-outs enqueued.",
        covered="Jobs done with every message they wrote sent.",
        pending="Jobs ready or leased, plus messages not yet final (as status counts them).",
        dead="Dead jobs plus dead messages (as status counts them).",
        ambiguous="Messages held ambiguous.",
    )
    coverage = GaugeMetricFamily(
        "oncebox_period_coverage", "Covered over eligible (absent before a fan-out).", labels=labels
    )
    judged = _families(
        "oncebox_period_slo_",
        labels,
        on_time="Subjects covered within the SLO's window of the fire.",
        sli="On time over eligible.",
        allowed_misses="The error budget: subjects that may miss the window.",
        misses="Certain misses so far (late; dead or held subjects while open).",
        budget_left="Allowed misses left; below 0 the promise is broken.",
        projected_misses="Misses projected by the window's end at the current rate.",
        at_risk="1 when the projected misses exceed the budget.",
        closed="1 once the window has ended (the figures are final).",
    )
    for schedule in data["schedules"]:
        for stats in schedule["periods"]:
            key = [schedule["name"], stats["period"]]
            for name, family in figures.items():
                if stats[name] is not None:  # eligible: not before the first scan ends
                    family.add_metric(key, stats[name])
            if stats["coverage"] is not None:
                coverage.add_metric(key, stats["coverage"])
            slo = stats["slo"]
            for name, family in judged.items() if slo is not None else ():
                if slo[name] is not None:
                    family.add_metric(key, float(slo[name]))
    yield from figures.values()
    yield coverage
    yield from judged.values()


def _families(prefix: str, labels: list[str], **texts: str) -> dict[str, GaugeMetricFamily]:
    """One labelled gauge family per figure, named `prefix` + the figure."""
    return {
        name: GaugeMetricFamily(prefix + name, text, labels=labels) for name, text in texts.items()
    }


def _one(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, value=value)


class ProcessCollector(Collector):
    """One process's own figures (`oncebox.kernel.metrics.Metrics`): nothing store-wide."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self.metrics.counters().items()):
            yield CounterMetricFamily(
                f"oncebox_process_{name}", f"{name}, in this process.", value=value
            )
        labels = ["operation"]
        calls = CounterMetricFamily(
            "oncebox_store_operation_calls", "Store operations called.", labels=labels
        )
        errors = CounterMetricFamily(
            "oncebox_store_operation_errors", "Store operations that raised.", labels=labels
        )
        seconds = CounterMetricFamily(
            "oncebox_store_operation_seconds", "Time spent in store operations.", labels=labels
        )
        for name, stats in sorted(self.metrics.operations().items()):
            calls.add_metric([name], stats.calls)
            errors.add_metric([name], stats.errors)
            seconds.add_metric([name], stats.seconds)
        yield from (calls, errors, seconds)
