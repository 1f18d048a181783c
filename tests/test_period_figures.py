"""The exporter reads the schedules' period figures — which read every job and message of a
period — from a refresh in the background, never on the scrape; every other figure is read on
the scrape itself, from the depths and index probes."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.core import Metric

from oncebox.cli.prometheus import StoreCollector
from oncebox.kernel.clock import ClockSetting
from oncebox.status import PeriodFigures
from support.digest_schedule import scheduled_box
from support.seeded_work import work_seeded

PERIOD = "2026-W33"


def samples(collector: StoreCollector) -> dict[str, float]:
    found: dict[str, float] = {}
    family: Metric
    for family in collector.collect():
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def test_a_scrape_reads_the_period_figures_of_the_last_refresh_and_the_depths_live(sqlite_url):
    box = scheduled_box(sqlite_url, customers=3)
    try:
        box.run_schedule("weekly-digest", PERIOD)
        figures = PeriodFigures(box)
        collector = StoreCollector(box, figures)
        key = f"period={PERIOD},schedule=weekly-digest"
        before = samples(collector)
        assert before[f"oncebox_period_pending{{{key}}}"] == 3
        assert before["oncebox_jobs{state=ready}"] == 3

        work_seeded(box)
        stale = samples(collector)
        assert stale["oncebox_jobs{state=done}"] == 3  # the depths: read on the scrape
        assert stale[f"oncebox_period_pending{{{key}}}"] == 3  # the periods: not yet refreshed
        assert stale["oncebox_period_figures_age_seconds"] >= 0

        figures.refresh()
        fresh = samples(collector)
        assert fresh[f"oncebox_period_pending{{{key}}}"] == 0
        assert fresh[f"oncebox_period_covered{{{key}}}"] == 3
    finally:
        box.close()


def test_without_a_background_refresh_a_scrape_reads_the_periods_itself(sqlite_url):
    box = scheduled_box(sqlite_url, customers=2)
    try:
        box.run_schedule("weekly-digest", PERIOD)
        collector = StoreCollector(box)
        box.work(until_idle=True)
        found = samples(collector)
        assert found[f"oncebox_period_covered{{period={PERIOD},schedule=weekly-digest}}"] == 2
        assert found["oncebox_period_figures_age_seconds"] == 0
    finally:
        box.close()


def test_a_scrape_shows_the_backlog_per_task_and_how_long_its_first_job_has_been_due(sqlite_url):
    box = scheduled_box(sqlite_url, customers=2)
    try:
        box.run_schedule("weekly-digest", PERIOD)
        box.store.clock_set(ClockSetting(offset=timedelta(minutes=10)))
        found = samples(StoreCollector(box))
        key = "kind=job,name=weekly_digest"
        assert (found[f"oncebox_waiting{{{key}}}"], found[f"oncebox_held{{{key}}}"]) == (2, 0)
        assert 600 <= found[f"oncebox_oldest_due_age_seconds{{{key}}}"] < 660
        assert found["oncebox_past_lease{kind=job}"] == 0
    finally:
        box.close()
