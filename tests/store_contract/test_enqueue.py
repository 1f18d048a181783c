"""Enqueue on every store: dedupe at the door, transactional enqueue, limits, timers."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from oncebox import (
    Box,
    ConfigurationError,
    InvalidArguments,
    InvalidKey,
    InvalidState,
    NotFound,
    PayloadTooLarge,
    Retry,
    UnknownTask,
)
from oncebox.store.params import insert_chunks
from oncebox.store.postgres import PostgresStore
from oncebox.store.sqlite import SqliteStore
from oncebox.testing import FrozenClock, assert_enqueued, drain, refute_enqueued

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


def declare(box: Box):
    @box.task(key="weekly-digest/customer-{customer_id}/{period}")
    def weekly_digest(ctx, customer_id: int, period: str) -> None:
        pass

    return weekly_digest


def test_enqueueing_an_active_key_returns_the_existing_job_and_writes_nothing(box: Box):
    task = declare(box)
    first = box.enqueue(task, customer_id=42, period="2026-W33")
    again = box.enqueue(task, customer_id=42, period="2026-W33")
    assert first.created and first.state == "ready" and first.reason == "created"
    assert (again.created, again.job_id, again.state, again.reason) == (
        False,
        first.job_id,
        "ready",
        "active_job",
    )
    assert box.store.job_count_by_state()["ready"] == 1
    assert box.metrics.counter("enqueue_deduplicated") == 1


def test_enqueueing_a_claimed_key_is_a_no_op_that_says_so(box: Box):
    task = declare(box)
    first = box.enqueue(task, customer_id=7, period="2026-W33")
    drain(box)
    again = box.enqueue(task, customer_id=7, period="2026-W33")
    assert (again.created, again.state, again.reason, again.job_id) == (
        False,
        "claimed",
        "key_claimed",
        first.job_id,
    )
    assert box.store.job_count_by_state().counts == {"done": 1, "done:completed": 1}


def test_bulk_enqueue_is_one_set_and_skips_taken_keys(box: Box):
    task = declare(box)
    box.enqueue(task, customer_id=1, period="2026-W33")
    result = box.enqueue_many(
        task, [{"customer_id": i, "period": "2026-W33"} for i in [1, 2, 3, 3, 4]]
    )
    assert (result.created, result.skipped) == (3, 2)
    assert box.store.job_count_by_state()["ready"] == 4


def test_one_bad_job_in_a_bulk_enqueue_writes_nothing(box: Box):
    task = declare(box)
    rows = [{"customer_id": i, "period": "2026-W33"} for i in range(5)]
    rows.append({"customer_id": 5, "period": "a/b"})
    with pytest.raises(InvalidKey):
        box.enqueue_many(task, rows)
    assert box.store.job_count_by_state().counts == {}


def test_a_bad_job_after_earlier_chunks_rolls_the_whole_set_back(
    box: Box, monkeypatch: pytest.MonkeyPatch
):
    """On PostgreSQL chunks go to the server while later jobs are still being checked: a bad
    job found after that must still leave nothing behind (SQLite checks all before writing)."""
    task = declare(box)
    store_module = type(box.store).__module__
    monkeypatch.setattr(f"{store_module}.INSERT_CHUNK", 10)
    chunks: list[int] = []
    split = insert_chunks

    def recorded(*args: Any) -> Iterator[list[Any]]:
        for chunk in split(*args):
            chunks.append(len(chunk))
            yield chunk

    monkeypatch.setattr(f"{store_module}.insert_chunks", recorded)

    def rows() -> Iterator[dict[str, object]]:
        yield from ({"customer_id": i, "period": "2026-W33"} for i in range(35))
        yield {"customer_id": 35, "period": "a/b"}

    with pytest.raises(InvalidKey):
        box.enqueue_many(task, rows())
    assert chunks == [10, 10, 10]  # three whole chunks came before the bad job
    assert box.store.job_count_by_state().counts == {}
    again = box.enqueue_many(task, ({"customer_id": i, "period": "2026-W33"} for i in range(35)))
    assert (again.created, again.skipped, len(again.job_ids)) == (35, 0, 35)
    assert chunks[3:] == [10, 10, 10, 5]


def test_oversized_args_are_rejected_with_size_and_limit_and_nothing_written(store_url: str):
    box = Box(store_url, max_payload_bytes=1024)
    try:

        @box.task(key="report/{name}")
        def report(ctx, name: str, body: str) -> None:
            pass

        with pytest.raises(
            PayloadTooLarge, match=r"are 2024 bytes as JSON; the limit is 1024 bytes"
        ):
            box.enqueue(report, name="big", body="x" * 2000)
        assert box.store.job_count_by_state().counts == {}
    finally:
        box.close()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"customer_id": 1}, InvalidArguments),
        ({"customer_id": 1, "period": "W1", "extra": 2}, InvalidArguments),
        ({"customer_id": 1, "period": "bad period"}, InvalidKey),
    ],
)
def test_arguments_are_checked_before_anything_is_written(box: Box, args, error):
    task = declare(box)
    with pytest.raises(error):
        box.enqueue_args(task, args)
    assert box.store.job_count_by_state().counts == {}


def test_unknown_tasks_are_refused_at_enqueue(box: Box):
    with pytest.raises(UnknownTask, match="no task named 'nope'"):
        box.enqueue("nope", x=1)


def test_a_task_parameter_named_like_an_enqueue_option_is_refused_at_declaration(box: Box):
    with pytest.raises(ConfigurationError, match="delay"):

        @box.task(key="x/{delay}")
        def bad(ctx, delay: int) -> None:
            pass


def test_a_caller_transaction_that_rolls_back_leaves_no_job(box: Box):
    task = declare(box)
    conn = _caller_connection(box)
    try:
        box.enqueue(task, customer_id=1, period="2026-W33", connection=conn)
        conn.rollback()
        box.enqueue(task, customer_id=2, period="2026-W33", connection=conn)
        conn.commit()
    finally:
        conn.close()
    ready = [j.key for j in box.store.job_find_by_key("weekly-digest/customer-2/2026-W33")]
    assert ready == ["weekly-digest/customer-2/2026-W33"]
    assert box.store.job_find_by_key("weekly-digest/customer-1/2026-W33") == []


def test_many_jobs_on_a_caller_connection_commit_and_roll_back_with_it(box: Box):
    task = declare(box)
    conn = _caller_connection(box)
    try:
        box.enqueue_many(task, [{"customer_id": 1, "period": "2026-W33"}], connection=conn)
        conn.rollback()
        result = box.enqueue_many(
            task, [{"customer_id": c, "period": "2026-W33"} for c in (2, 3)], connection=conn
        )
        conn.commit()
    finally:
        conn.close()
    assert result.created == 2
    assert box.store.job_find_by_key("weekly-digest/customer-1/2026-W33") == []
    assert len(box.store.job_find_by_key("weekly-digest/customer-3/2026-W33")) == 1


def _caller_connection(box: Box):
    if isinstance(box.store, SqliteStore):
        import sqlite3

        return sqlite3.connect(box.store.path)
    import psycopg

    assert isinstance(box.store, PostgresStore)
    return psycopg.connect(box.store.conninfo)


def test_a_delayed_job_is_a_durable_timer_that_runs_when_due(box: Box):
    ran = []

    @box.task(key="hold-expired/hold-{hold_id}")
    def expire(ctx, hold_id: int) -> None:
        ran.append(hold_id)

    with FrozenClock(box, at=T0) as clock:
        box.enqueue(expire, hold_id=1, delay=timedelta(days=400))
        box.enqueue(expire, hold_id=2, run_at=T0 + timedelta(minutes=30))
        assert drain(box).completed == 0
        clock.advance(timedelta(minutes=30))
        assert drain(box).completed == 1 and ran == [2]
        clock.advance(timedelta(days=400))
        assert drain(box).completed == 1 and ran == [2, 1]


def test_cancel_withdraws_a_ready_timer_and_is_audited(box: Box):
    @box.task(key="hold-expired/hold-{hold_id}")
    def expire(ctx, hold_id: int) -> None:
        raise AssertionError("a cancelled timer must not run")

    with FrozenClock(box, at=T0) as clock:
        job = box.enqueue(expire, hold_id=9, delay=timedelta(hours=1))
        outcome = box.cancel("hold-expired/hold-9", reason="hold confirmed")
        assert outcome.id == job.job_id
        refute_enqueued(box, key="hold-expired/hold-9")
        clock.advance(timedelta(hours=2))
        assert drain(box).completed == 0
    audit = box.store.audit_list(target_id=job.job_id)
    assert [(a.action, a.reason) for a in audit] == [("cancel", "hold confirmed")]
    with pytest.raises(NotFound):
        box.cancel("hold-expired/hold-404")
    # the key is free again: a cancelled job holds no intent
    assert box.enqueue(expire, hold_id=9, delay=timedelta(hours=1)).created
    assert_enqueued(box, key="hold-expired/hold-9")


def test_only_ready_jobs_can_be_cancelled(box: Box):
    task = declare(box)
    box.enqueue(task, customer_id=1, period="2026-W33")
    drain(box)
    with pytest.raises(InvalidState, match="is done"):
        box.cancel("weekly-digest/customer-1/2026-W33")


def test_keyless_tasks_are_plain_at_least_once_jobs(box: Box):
    @box.task
    def ping(ctx, n: int) -> None:
        assert ctx.key is None

    assert box.enqueue(ping, n=1).created and box.enqueue(ping, n=1).created
    assert drain(box).completed == 2
    assert box.store.intent_count() == 0


def test_bulk_rows_are_chunked_by_count_and_by_argument_size():
    rows = [(f"k/{i}", "x" * size, None, None) for i, size in enumerate([3, 3, 3, 9, 1, 1, 1, 1])]
    chunks = list(insert_chunks(iter(rows), count=3, chars=8))
    assert [[row[0] for row in chunk] for chunk in chunks] == [
        ["k/0", "k/1", "k/2"],  # three rows: the count
        ["k/3"],  # one row over the size alone
        ["k/4", "k/5", "k/6"],
        ["k/7"],
    ]


def test_a_handler_enqueues_a_follow_up_in_the_claims_transaction(box: Box):
    """`connection=ctx.connection`: the follow-up job commits with the claim, or not at all —
    a handler that raises after it leaves no follow-up, and its retry enqueues it once."""
    failures = [RuntimeError("after the follow-up")]

    @box.task(key="notice/{n}")
    def notice(ctx, n: int) -> None:
        pass

    @box.task(key="order/{n}", retry=Retry(max_attempts=2, base_delay=timedelta(0)))
    def order(ctx, n: int) -> None:
        box.enqueue(notice, n=n, connection=ctx.connection)
        if failures:
            raise failures.pop()

    box.enqueue(order, n=1)
    first = drain(box, raise_on_failure=False)
    assert first.retried == 1
    [job] = box.store.job_find_by_key("order/1")
    assert job.state == "done"  # its retry ran in the same drain
    [follow_up] = box.store.job_find_by_key("notice/1")
    assert (follow_up.state, follow_up.attempt) == ("done", 1)


def test_a_handler_whose_claim_rolls_back_leaves_no_follow_up(box: Box):
    @box.task(key="notice/{n}")
    def notice(ctx, n: int) -> None:
        pass

    @box.task(key="order/{n}", retry=Retry(max_attempts=1))
    def order(ctx, n: int) -> None:
        box.enqueue(notice, n=n, connection=ctx.connection)
        raise RuntimeError("the order cannot be placed")

    box.enqueue(order, n=2)
    drain(box, raise_on_failure=False)
    assert box.store.job_find_by_key("order/2")[0].state == "dead"
    assert box.store.job_find_by_key("notice/2") == []
