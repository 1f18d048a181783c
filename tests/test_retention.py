"""Retention as a user sets it (`Box(retention=...)`, `keep_jobs=`, `keep_payloads=`,
`keep_messages=`) and as the pruner lane and `oncebox prune` apply it: each kind goes when its
policy says, in the order that keeps the period figures whole, and what is kept is shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from oncebox import Box, ClockSetting, JobContext, Retention, ScheduleContext
from oncebox.jobs.periods import iso_week
from oncebox.kernel.errors import ConfigurationError
from oncebox.lanes import pruner as pruner_module
from oncebox.lanes.pruner import Pruner, PrunerConfig, plan_for
from oncebox.retention.policy import FOREVER
from oncebox.status import status_data
from oncebox.testing import FrozenClock, MemoryProvider, drain

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)
TESTS = Path(__file__).resolve().parent
CODE = TESTS.parent / "src"


def digest_box(url: str, retention: Retention, **channel: timedelta) -> Box:
    box = Box(url, seed=3, secret="s" * 32, retention=retention)
    box.channel("email", provider=MemoryProvider(), **channel)

    @box.task(key="digest/{customer}")
    def digest(ctx: JobContext, customer: int) -> None:
        ctx.outbox.email(to=f"c{customer}@example.com", subject="week", text="hello")

    @box.task(key="invoice/{n}", keep_jobs=FOREVER)
    def invoice(ctx: JobContext, n: int) -> None:
        pass

    return box


def counts(box: Box) -> dict[str, int]:
    return {k: v for k, v in box.store.counter_list().items() if k.startswith(("prun", "payl"))}


def test_the_pruner_takes_each_kind_when_its_policy_says_and_never_before(store_url: str):
    box = digest_box(
        store_url, Retention(jobs=14 * DAY, payloads=2 * DAY, messages=30 * DAY), keep_payloads=DAY
    )
    try:
        with FrozenClock(box, at=T0) as clock:
            box.enqueue_many("digest", [{"customer": c} for c in range(3)])
            box.enqueue("invoice", n=1)
            drain(box)
            pruner = Pruner.for_runtime(box.runtime, PrunerConfig())
            assert pruner.run_once().total() == 0

            clock.advance(DAY + timedelta(seconds=1))  # the channel's own keep_payloads
            assert pruner.run_once().pruned["payloads"] == 3
            [message] = box.store.outbox_find_by_key("digest/0")
            assert (json.loads(message.payload_json), message.state) == ({}, "sent")
            assert message.receipt is not None

            clock.advance(14 * DAY)
            result = pruner.run_once()
            # PostgreSQL: a finished job goes with the week it finished in (the history's
            # partitions, 0025), once that whole week is past its retention
            weekly = box.store.keeps_history
            assert result.pruned["jobs"] == (0 if weekly else 3)
            if weekly:
                clock.advance(6 * DAY)  # Monday 7 September: the week of 17 August, 14 days past
                assert pruner.run_once().pruned["jobs"] == 3
            assert box.store.job_find_by_key("invoice/1") is not None  # kept for ever
            assert box.store.outbox_find_by_key("digest/0") != []  # 30 days for messages

            clock.advance((10 if weekly else 16) * DAY)
            assert pruner.run_once().pruned["messages"] == 3
            assert box.store.outbox_find_by_key("digest/0") == []
            assert box.store.intent_get("digest/0") is not None  # intents: for ever
            again = box.enqueue("digest", customer=0)
            assert (again.created, again.reason) == (False, "key_claimed")
        # a message's attempts went with it (the attempts' own 30 days had not passed)
        assert counts(box) == {"payloads_dropped": 3, "pruned_jobs": 3, "pruned_messages": 3}
    finally:
        box.close()


def test_status_shows_what_retention_holds_and_what_waits_for_the_pruner(sqlite_url: str):
    box = digest_box(sqlite_url, Retention(payloads=DAY))
    try:
        with FrozenClock(box, at=T0) as clock:
            box.enqueue_many("digest", [{"customer": c} for c in range(3)])
            drain(box)
            clock.advance(2 * DAY)
            held = {(e["kind"], e["name"]): e for e in status_data(box, 1)["retention"]}
        payloads = held[("payloads", "email")]
        assert payloads["keep_s"] == DAY.total_seconds()
        assert (payloads["oldest"], payloads["waiting"]) == ("2026-08-17T09:00:00Z", 3)
        assert payloads["oldest_age_s"] == (2 * DAY).total_seconds()
        assert held[("jobs", "digest")]["waiting"] == 0
        assert held[("intents", "digest")]["keep_s"] is None
    finally:
        box.close()


def test_a_draining_pruner_waits_as_long_as_its_pass_took(monkeypatch, sqlite_url: str):
    """Paced at duty 0.5: a backlog drains steadily instead of taking the database from the
    workers; a pass with nothing full waits the interval."""
    box = digest_box(sqlite_url, Retention(payloads=timedelta(0)))
    waits: list[float] = []

    class Stop:
        def is_set(self) -> bool:
            return len(waits) >= 3

        def wait(self, seconds: float) -> bool:
            waits.append(seconds)
            return False

    try:
        with FrozenClock(box, at=T0) as clock:
            box.enqueue_many("digest", [{"customer": c} for c in range(3)])
            drain(box)
            clock.advance(DAY)
            ticks = iter([10.0, 12.5, 20.0, 21.0, 30.0, 30.5])
            monkeypatch.setattr(pruner_module, "monotonic", lambda: next(ticks))
            pruner = Pruner.for_runtime(box.runtime, PrunerConfig(batch_size=2, duty=0.5))
            pruner.run_forever(Stop())  # type: ignore[arg-type]
    finally:
        box.close()
    # pass 1: 2 payloads (full) took 2.5 s, waits 2.5 s; pass 2: the last one, not full: it
    # waits the interval; pass 3: nothing
    assert waits == [2.5, 600.0, 600.0]


def test_retention_settings_are_checked_where_they_are_declared(open_box, sqlite_url: str):
    box = open_box(sqlite_url)

    def late(ctx: JobContext) -> None:
        pass

    with pytest.raises(ConfigurationError, match="Retention: jobs must be a timedelta"):
        Retention(jobs=-DAY)
    with pytest.raises(ConfigurationError, match="task 'late': keep_jobs must be a timedelta"):
        box.task(keep_jobs=14)(late)
    with pytest.raises(ConfigurationError, match="channel 'email': keep_payloads must be"):
        box.channel("email", keep_payloads=-DAY)
    assert Retention(audit=FOREVER).audit is None


def test_the_plan_never_goes_below_what_the_rows_still_serve(sqlite_url):
    """A sent message waits for its job: a shorter message retention would only make each pass
    step over messages whose jobs are kept, so the plan raises it (a FOREVER task aside); a
    schedule run is kept at least its schedule's catch-up window."""
    box = digest_box(sqlite_url, Retention(jobs=14 * DAY, messages=DAY))
    try:

        @box.task(key="report/{n}", keep_jobs=30 * DAY)
        def report(ctx: JobContext, n: int) -> None:
            pass

        @box.schedule(
            "weekly", cron="0 9 * * 1", period=iso_week, task="digest", catch_up_window=60 * DAY
        )
        def everyone(ctx: ScheduleContext) -> list[dict[str, int]]:
            return [{"customer": 1}]

        plan = plan_for(box.runtime)
        assert plan.policy("messages", "email") == 30 * DAY  # not the invoice's FOREVER
        assert plan.policy("payloads", "email") == 7 * DAY
        assert plan.policy("jobs", "invoice") is None and plan.policy("jobs", "report") == 30 * DAY
        assert plan.policy("jobs", "a-task-this-app-lacks") == 14 * DAY
        assert plan.policy("schedule_runs", "weekly") is None  # for ever, by default
        runs = plan_for(box.runtime)
        runs = type(runs)(Retention(schedule_runs=DAY), runs.tasks, runs.channels, runs.schedules)
        assert runs.policy("schedule_runs", "weekly") == 60 * DAY  # its catch-up window
        assert runs.policy("schedule_runs", "gone") == 31 * DAY  # Schedule's default window
    finally:
        box.close()


def oncebox(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(CODE)]), "ONCEBOX_DB": db}
    return subprocess.run(
        [sys.executable, "-m", "oncebox.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_prune_dry_run_says_what_prune_then_takes(sqlite_url: str):
    box = digest_box(sqlite_url, Retention())
    try:
        with FrozenClock(box, at=T0):
            box.enqueue_many("digest", [{"customer": c} for c in range(4)])
            drain(box)
        box.store.clock_set(ClockSetting(frozen_at=T0 + 8 * DAY))  # held by no one here
    finally:
        box.close()
    app = "support.retention_app"
    refused = oncebox("prune", "--dry-run", "--app", app, db=sqlite_url)
    assert refused.returncode == 1 and "--simulated-time" in refused.stderr  # a frozen clock
    assert len(refused.stderr.strip().splitlines()) == 1

    dry = oncebox("prune", "--dry-run", "--simulated-time", "--app", app, "--json", db=sqlite_url)
    assert dry.returncode == 0, dry.stderr
    waiting = {e["kind"]: e["waiting"] for e in json.loads(dry.stdout)["retention"]}
    assert waiting == {
        "jobs": 0,
        "intents": 0,
        "payloads": 4,
        "messages": 0,
        "delivery_attempts": 0,
        "provider_events": 0,
        "audit": 0,
    }
    text = oncebox("prune", "--dry-run", "--simulated-time", "--app", app, db=sqlite_url)
    assert "message payloads   7d" in text.stdout and text.returncode == 0

    done = oncebox("prune", "--simulated-time", "--app", app, db=sqlite_url)
    assert done.returncode == 0, done.stderr
    assert "pruned 0 finished jobs, 0 intents, 4 message payloads" in done.stdout
    again = oncebox("prune", "--dry-run", "--simulated-time", "--app", app, "--json", db=sqlite_url)
    assert all(e["waiting"] == 0 for e in json.loads(again.stdout)["retention"])
    shown = oncebox("outbox", "show", "digest/0", db=sqlite_url)
    assert "content dropped by retention at 2026-08-25T09:00:00Z (receipt kept)" in shown.stdout
    assert "c0@example.com" not in shown.stdout


def test_prune_without_an_app_is_a_usage_mistake(sqlite_url: str):
    missing = oncebox("prune", "--dry-run", db=sqlite_url)
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        "oncebox: --app MODULE is required (or set ONCEBOX_APP): the module that holds your Box"
    )


def test_a_history_by_week_stretches_a_weeks_retention_to_the_monday_its_cutoff_falls_in():
    from oncebox.retention.policy import by_week

    wednesday = datetime(2026, 9, 2, 15, 30, tzinfo=UTC)  # 14 days back: Wednesday 19 August
    stretched = by_week(14 * DAY, wednesday)
    assert wednesday - stretched == datetime(2026, 8, 17, tzinfo=UTC)  # that week's Monday
    monday = datetime(2026, 8, 31, tzinfo=UTC)  # a cutoff already on a Monday stays
    assert by_week(14 * DAY, monday) == 14 * DAY
    assert by_week(DAY, wednesday) == DAY  # shorter than a week: by batches, as asked
