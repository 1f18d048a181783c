"""The key-drift guard on every store: a deploy that changes a task's key template or a
schedule's periods is refused — no enqueue, no lease, no fan-out — until an operator accepts it,
and the acceptance is audited and reaches processes still running the old code."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from oncebox import Box, JobContext
from oncebox.jobs.keyguard import KeyGuard, schedule_canary, task_canary
from oncebox.jobs.periods import day, iso_week
from oncebox.jobs.tasks import make_task
from oncebox.kernel.errors import ConfigurationError, KeyDrift, NotFound
from oncebox.schedules.schedule import make_schedule
from oncebox.testing import FrozenClock, drain
from support.db import record_effect, sql
from support.digest_schedule import scheduled_box

MONDAY_W33 = datetime(2026, 8, 10, 9, 0, 30, tzinfo=UTC)


@pytest.fixture
def made() -> Iterator[Callable[..., Box]]:
    """`factory(*args)`, closed at teardown: each box is one deploy of the code."""
    built: list[Box] = []

    def make(factory: Callable[..., Box], *args: Any, **kwargs: Any) -> Box:
        built.append(factory(*args, **kwargs))
        return built[-1]

    yield make
    for box in built:
        box.close()


def digest_box(url: str, template: str) -> Box:
    box = Box(url)

    @box.task(name="digest", key=template)
    def digest(ctx: JobContext, customer_id: int, period: str) -> None:
        record_effect(ctx)

    sql(box, "CREATE TABLE IF NOT EXISTS effects (key TEXT, note TEXT)")
    return box


def effects(box: Box) -> list[str]:
    return sorted(r[0] for r in sql(box, "SELECT key FROM effects"))


def test_a_changed_key_template_is_refused_until_accepted(store_url, made):
    old = made(digest_box, store_url, "digest/customer-{customer_id}/{period}")
    old.enqueue("digest", customer_id=1, period="2026-W33")
    drain(old)

    new = made(digest_box, store_url, "digest/{customer_id}/{period}")
    with pytest.raises(KeyDrift) as refused:
        new.enqueue("digest", customer_id=1, period="2026-W33")
    message = str(refused.value)
    assert "'digest/customer-{customer_id}/{period}' -> 'digest/{customer_id}/{period}'" in message
    assert "oncebox keys accept task:digest" in message
    with pytest.raises(KeyDrift):
        new.enqueue_many("digest", [{"customer_id": 2, "period": "2026-W33"}])
    assert [r[0] for r in sql(new, "SELECT count(*) FROM oncebox_all_jobs")] == [1]

    audit_id = new.key_guard.accept("digest", actor="ops", reason="customer prefix dropped")
    assert audit_id is not None
    [entry] = new.store.audit_list(limit=1)
    assert (entry.action, entry.target_kind, entry.target_key, entry.reason) == (
        "accept-keys",
        "task",
        "digest",
        "customer prefix dropped",
    )
    new.enqueue("digest", customer_id=1, period="2026-W33")
    drain(new)
    assert effects(new) == ["digest/1/2026-W33", "digest/customer-1/2026-W33"]

    # the process still running the old template refuses once it reads the store again
    old.key_guard.forget()
    with pytest.raises(KeyDrift):
        old.enqueue("digest", customer_id=3, period="2026-W33")


def test_a_worker_leaves_a_drifted_tasks_jobs_ready_and_says_why(store_url, made, caplog):
    old = made(digest_box, store_url, "digest/customer-{customer_id}/{period}")
    old.enqueue("digest", customer_id=1, period="2026-W33")
    new = made(digest_box, store_url, "digest/c-{customer_id}/{period}")

    with caplog.at_level(logging.ERROR, logger="oncebox.keys"):
        result = drain(new)
        drain(new)
    assert result.completed == 0
    assert [j.state for j in new.store.job_find_by_key("digest/customer-1/2026-W33")] == ["ready"]
    refusals = [r for r in caplog.records if "refusing task 'digest'" in r.getMessage()]
    assert len(refusals) == 1  # said once, not on every poll

    new.key_guard.accept("task:digest", actor="ops", reason="renamed the prefix")
    drain(new)
    assert effects(new) == ["digest/customer-1/2026-W33"]  # the job keeps the key it was given


def test_a_changed_period_function_is_refused_until_accepted(store_url, made):
    first = made(scheduled_box, store_url, customers=3)
    with FrozenClock(first, at=MONDAY_W33):
        first.run_schedule("weekly-digest", "2026-W33")

    moved = made(scheduled_box, store_url, customers=0, tz="Pacific/Kiritimati")
    with FrozenClock(moved, at=MONDAY_W33) as clock:
        with pytest.raises(KeyDrift) as refused:
            moved.run_schedule("weekly-digest", "2026-W33")
        assert "periods changed" in str(refused.value)
        assert "'iso_week in UTC' -> 'iso_week in Pacific/Kiritimati'" in str(refused.value)
        moved.store.schedule_state("weekly-digest", moved.schedules["weekly-digest"].grace)
        clock.advance(timedelta(days=7))
        ticked = moved.ticker().run_once()
        assert (ticked.refused, ticked.fan_outs) == (["weekly-digest"], [])

        moved.key_guard.accept(
            "schedule:weekly-digest", actor="ops", reason="customers in Kiribati"
        )
        assert [f.period for f in moved.ticker().run_once().fan_outs] == ["2026-W34"]


def test_a_period_kind_change_is_drift_too(store_url, made):
    made(scheduled_box, store_url).key_guard.require_schedule(
        made(scheduled_box, store_url).schedules["weekly-digest"]
    )
    daily = made(scheduled_box, store_url, period=day, cron="0 9 * * *")
    with pytest.raises(KeyDrift):
        daily.key_guard.require_schedule(daily.schedules["weekly-digest"])


def test_unchanged_code_records_its_canaries_once_and_keyless_tasks_none(store_url, made):
    boxes = [made(digest_box, store_url, "digest/{customer_id}/{period}") for _ in range(2)]

    @boxes[0].task
    def keyless(ctx: JobContext) -> None:
        pass

    for box in boxes:
        box.enqueue("digest", customer_id=1, period="2026-W33")
    boxes[0].enqueue(keyless)
    assert [(c.kind, c.name) for c in boxes[0].store.key_canary_list()] == [("task", "digest")]
    assert boxes[1].key_guard.accept("digest", actor="ops", reason="no change") is None
    assert boxes[0].store.audit_list() == []


def test_keys_check_reports_ok_new_drifted_and_gone(store_url, made):
    recorded = made(scheduled_box, store_url)
    recorded.key_guard.require_schedule(recorded.schedules["weekly-digest"])
    recorded.enqueue("weekly_digest", customer_id=1, period="2026-W33")

    changed = Box(store_url)
    try:

        @changed.task(key="weekly-digest/{customer_id}/{period}")
        def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
            pass

        @changed.task(key="hold-expired/hold-{hold_id}")
        def hold_expired(ctx: JobContext, hold_id: int) -> None:
            pass

        statuses = {(s.kind, s.name): s.status for s in changed.key_guard.check()}
    finally:
        changed.close()
    assert statuses == {
        ("task", "weekly_digest"): "drifted",
        ("task", "hold_expired"): "new",
        ("schedule", "weekly-digest"): "not in code",
    }


def test_accepting_an_unknown_or_ambiguous_name_is_refused(store_url, made):
    box = made(scheduled_box, store_url)
    with pytest.raises(NotFound, match="no task or schedule named 'nope'"):
        box.key_guard.accept("nope", actor="ops", reason="r")
    with pytest.raises(NotFound, match="no schedule 'weekly_digest'"):
        box.key_guard.accept("schedule:weekly_digest", actor="ops", reason="r")


def test_a_verified_canary_is_read_again_after_a_minute(store_url, made):
    box = made(digest_box, store_url, "digest/{customer_id}/{period}")
    now = [0.0]
    guard = KeyGuard(box.store, box.registry.all, lambda: [], clock=lambda: now[0])
    task = box.registry.resolve("digest")
    guard.require_task(task)
    other = made(digest_box, store_url, "digest/x-{customer_id}/{period}")
    other.key_guard.accept("digest", actor="ops", reason="moved on")
    now[0] = 59.0
    guard.require_task(task)  # still trusted from the last read
    now[0] = 61.0
    with pytest.raises(KeyDrift):
        guard.require_task(task)


def weekly(tz: str = "UTC"):
    return make_schedule(
        "weekly-digest",
        cron="0 9 * * MON",
        tz=tz,
        period=iso_week,
        task="t",
        eligible=lambda ctx: [],
    )


def test_canaries_span_iso_year_boundaries_and_timezones():
    utc = schedule_canary(weekly()).outputs
    assert {"2020-W53", "2026-W53", "2026-W01", "2021-W01"} <= set(utc)
    assert not any(period.startswith("2027-W53") for period in utc)
    for tz in ("Europe/Berlin", "America/New_York", "Australia/Sydney"):
        assert schedule_canary(weekly(tz)).outputs != utc
    assert schedule_canary(weekly()).outputs == utc  # deterministic


def canary_of(template: str, *params: str):
    namespace: dict[str, Any] = {}
    exec(  # noqa: S102 (a handler with exactly these parameters)
        f"def handler(ctx, {', '.join(params)}): pass", namespace
    )
    task = make_task(
        namespace["handler"],
        name="t",
        key=template,
        retry=None,
        timeout=60,
        priority=0,
        queue="default",
        group_by=None,
        keep_intents=None,
    )
    canary = task_canary(task)
    assert canary is not None
    return canary.outputs


def test_task_canaries_see_swapped_placeholders_and_a_different_argument():
    base = canary_of("weekly-digest/customer-{customer_id}/{period}", "customer_id", "period")
    assert base[0] == "weekly-digest/customer-customer_id/period"
    assert base == canary_of(
        "weekly-digest/customer-{customer_id}/{period}", "period", "customer_id"
    )
    swapped = canary_of("weekly-digest/customer-{period}/{customer_id}", "customer_id", "period")
    other = canary_of("weekly-digest/customer-{account_id}/{period}", "account_id", "period")
    literal = canary_of("weekly-digest/{customer_id}/{period}", "customer_id", "period")
    assert len({base, swapped, other, literal}) == 4


def test_a_long_template_that_renders_valid_keys_renders_its_canaries():
    template = "x" * 230 + "/{a}/{b}"
    outputs = canary_of(template, "a", "b")
    assert all(not output.startswith("!") for output in outputs)


def test_a_first_enqueue_inside_the_callers_sqlite_transaction_reads_without_writing(
    sqlite_url, made
):
    import sqlite3

    box = made(digest_box, sqlite_url, "digest/{customer_id}/{period}")
    conn = sqlite3.connect(box.store.path, timeout=0.5)
    try:
        conn.execute("INSERT INTO effects (key) VALUES ('the caller holds the write lock')")
        box.enqueue("digest", customer_id=1, period="2026-W33", connection=conn)
        conn.commit()
    finally:
        conn.close()
    assert box.store.key_canary_list() == []  # recording would have waited on the caller's lock
    box.enqueue("digest", customer_id=2, period="2026-W33")
    assert [c.name for c in box.store.key_canary_list()] == ["digest"]


def test_keys_check_calls_a_renamed_tasks_waiting_jobs_orphaned(store_url, made):
    before = made(digest_box, store_url, "digest/{customer_id}/{period}")
    before.enqueue("digest", customer_id=1, period="2026-W33")
    renamed = Box(store_url)
    try:

        @renamed.task(name="weekly_digest", key="digest/{customer_id}/{period}")
        def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
            pass

        statuses = {(s.name, s.status): s.detail for s in renamed.key_guard.check()}
    finally:
        renamed.close()
    assert set(statuses) == {("weekly_digest", "new"), ("digest", "orphaned")}
    assert "renaming one is a data migration" in statuses[("digest", "orphaned")]
    drain(before)  # once its jobs are done, the old name is merely gone
    assert {s.status for s in before.key_guard.check()} == {"ok"}


def test_a_broker_delivery_of_a_drifted_task_is_given_back_not_run(store_url, made):
    from oncebox.testing import RedeliveringTransport

    old = made(digest_box, store_url, "digest/customer-{customer_id}/{period}")
    old.enqueue("digest", customer_id=1, period="2026-W33")
    new = made(digest_box, store_url, "digest/{customer_id}/{period}")
    broker = RedeliveringTransport(copies=1, seed=1)
    broker.publish("digest", customer_id=2, period="2026-W33")
    consumer = new.consumer(transport=broker)
    try:
        result = consumer.run_once()
    finally:
        consumer.session.close()
    assert (result.completed, result.released) == (0, 1)
    assert effects(new) == []


def test_redeclaring_a_task_with_another_template_or_a_schedule_twice_is_refused(sqlite_url, made):
    box = made(digest_box, sqlite_url, "digest/{customer_id}/{period}")
    task = box.registry.resolve("digest")
    with pytest.raises(ConfigurationError, match="declared twice with different key templates"):
        box.task(name="digest", key="digest/x-{customer_id}/{period}")(task.fn)
    scheduled = made(scheduled_box, sqlite_url)
    with pytest.raises(ConfigurationError, match="two schedules are named 'weekly-digest'"):
        scheduled.schedule(
            "weekly-digest", cron="0 9 * * *", tz="UTC", period=day, task="weekly_digest"
        )(lambda ctx: [])


def test_a_worker_until_idle_stops_and_names_a_drifted_tasks_waiting_jobs(store_url, made):
    old = made(digest_box, store_url, "digest/customer-{customer_id}/{period}")
    old.enqueue("digest", customer_id=1, period="2026-W33")
    new = made(digest_box, store_url, "digest/c-{customer_id}/{period}")
    result = new.work(until_idle=True)  # before: it waited for ever for jobs it refuses
    assert not result.settled and result.unserved == ["digest"]
    assert [(r.name, r.waiting) for r in result.remaining] == [("digest", 1)]
    assert str(result).endswith("1 job(s) of task digest (no live worker serves this task)")
