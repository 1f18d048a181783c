"""The consumer when things go wrong around a handler: transactions ended under it, escaping
errors, errors that cannot be stored, a batch cut by its time budget."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncebox import Box, ConsumerConfig, Retry
from oncebox.kernel import points
from oncebox.testing import RedeliveringTransport, drain
from support.db import create_effects, effects, record_effect, sql
from support.rows import job_row


def test_a_rollback_by_the_database_inside_a_handler_settles_the_batch_from_what_committed(
    sqlite_url,
):
    """SQLite's `INSERT OR ROLLBACK` ends the whole transaction from inside a handler (no guard
    can refuse legal SQL): the batch must be settled from what the database shows."""
    box = Box(sqlite_url)
    create_effects(box)
    sql(box, "CREATE TABLE taken (k TEXT PRIMARY KEY)")
    sql(box, "INSERT INTO taken VALUES ('x')")

    @box.task(key="t/{n}", retry=Retry(max_attempts=1))
    def t(ctx, n: int) -> None:
        record_effect(ctx, f"n{n}")
        if n == 2:
            ctx.connection.execute("INSERT OR ROLLBACK INTO taken VALUES ('x')")

    for n in (1, 2, 3):
        box.enqueue(t, n=n)
    result = drain(box, raise_on_failure=False)
    states = {n: (box.find(f"t/{n}")[0].state, box.find(f"t/{n}")[0].outcome) for n in (1, 2, 3)}
    assert states == {1: ("done", "completed"), 2: ("dead", None), 3: ("done", "completed")}
    assert effects(box) == [("t/1", "n1"), ("t/3", "n3")]
    assert {i for i in ("t/1", "t/2", "t/3") if box.store.intent_get(i)} == {"t/1", "t/3"}
    assert result.dead == 1
    box.close()


@pytest.mark.parametrize(
    "sneak",
    [
        lambda conn: conn.cursor().connection.commit(),
        lambda conn: conn.execute("SELECT 1; COMMIT"),
        lambda conn: conn.cursor().execute("/* x */ commit"),
        lambda conn: conn.cursor().executescript("COMMIT"),
    ],
    ids=["cursor-connection", "multi-statement", "cursor-execute", "executescript"],
)
def test_indirect_transaction_control_is_refused_too(box: Box, sneak):
    create_effects(box)

    @box.task(key="s/{n}", retry=Retry(max_attempts=1))
    def s(ctx, n: int) -> None:
        record_effect(ctx, "before")
        sneak(ctx.connection)

    box.enqueue(s, n=1)
    result = drain(box, raise_on_failure=False)
    assert result.dead == 1 and "TransactionControlRefused" in result.failures[0].error
    assert effects(box) == [] and box.store.intent_count() == 0


@pytest.mark.postgres
def test_a_composed_commit_is_refused_on_postgresql(pg_url):
    from psycopg import sql as pgsql

    box = Box(pg_url)
    create_effects(box)

    @box.task(key="c/{n}", retry=Retry(max_attempts=1))
    def c(ctx, n: int) -> None:
        record_effect(ctx, "before")
        ctx.connection.execute(pgsql.SQL("COMMIT"))

    box.enqueue(c, n=1)
    assert drain(box, raise_on_failure=False).dead == 1
    assert effects(box) == []
    box.close()


def test_an_error_that_escapes_a_batch_gives_its_leases_back(box: Box):
    @box.task(key="e/{n}")
    def e(ctx, n: int) -> None:
        pass

    for n in range(3):
        box.enqueue(e, n=n)
    consumer = box.consumer()
    try:
        with (
            points.installed(
                {
                    "consumer.after_handler_before_commit": points.raising(
                        RuntimeError("the process is going down")
                    )
                }
            ),
            pytest.raises(RuntimeError),
        ):
            consumer.run_once()
        assert consumer.transport.held_tokens() == []  # nothing left to heartbeat forever
    finally:
        consumer.session.close()
    jobs = [box.find(f"e/{n}")[0] for n in range(3)]
    assert [(j.state, j.attempt) for j in jobs] == [("ready", 0)] * 3
    assert drain(box).completed == 3


def test_an_error_text_with_a_nul_byte_is_stored(box: Box):
    @box.task(key="nul/{n}", retry=Retry(max_attempts=1))
    def nul(ctx, n: int) -> None:
        raise ValueError("binary body: \x00\x01")

    job = box.enqueue(nul, n=1).job_id
    assert drain(box, raise_on_failure=False).dead == 1
    assert "binary body: \\0" in (job_row(box, job).last_error or "")


def test_a_same_key_delivery_set_aside_is_not_lost_when_the_budget_cuts_the_batch(box: Box):
    @box.task(key="k/{n}")
    def t(ctx, n: int) -> None:
        pass

    broker = RedeliveringTransport(copies=1)
    for n in (1, 1, 2, 3):  # a duplicate publish of n=1
        broker.publish("t", n=n)
    broker._ready[:] = ["m4", "m3", "m2", "m1"]  # delivered m1, m2 (same key), m3, m4
    consumer = box.consumer(ConsumerConfig(transaction_budget=timedelta(0)), transport=broker)
    try:
        result = consumer.run_once()
    finally:
        consumer.session.close()
    assert (result.leased, result.completed, result.duplicates) == (4, 3, 1)
    assert sorted(m for m, _outcome in broker.acks) == ["m1", "m2", "m3", "m4"]


def test_an_idle_worker_does_not_spin_on_a_due_job_it_cannot_lease(box: Box):
    from datetime import UTC, datetime

    from oncebox.lanes.worker import WorkerConfig
    from oncebox.testing import FrozenClock

    @box.task(key="g/{name}", group_by="group", retry=Retry(max_attempts=3))
    def g(ctx, group: str, name: str) -> None:
        raise RuntimeError("head keeps failing")

    with FrozenClock(box, at=datetime(2026, 8, 17, tzinfo=UTC)):
        box.enqueue(g, group="a", name="head")
        box.enqueue(g, group="a", name="next")  # due, but blocked behind the retrying head
        drain(box, raise_on_failure=False)
        consumer = box.consumer()
        try:
            worker = box.worker(WorkerConfig(poll_interval=timedelta(seconds=7)))
            assert consumer.run_once().leased == 0
            # due but not leasable: look again soon (it may have just fallen due), then back
            # off to the poll interval (it may be blocked): a negative wait counts a miss
            waits = [worker._idle_wait(consumer.transport.next_due_in, m) for m in range(9)]
            assert waits[0] == pytest.approx(-0.05) and waits[1] == pytest.approx(-0.1)
            assert waits[8] == pytest.approx(-7.0)  # never longer than the poll interval
            assert sum(-w for w in waits) > 7.0  # nine looks span more than one poll
        finally:
            consumer.session.close()


def test_an_error_message_no_store_can_hold_is_kept_escaped_and_the_job_still_dies(box: Box):
    """A handler's error is whatever it raised: a file name decoded with `surrogateescape`
    carries a lone surrogate (not Unicode: no UTF-8, no JSON), a NUL cannot be in PostgreSQL's
    text. Recording the failed attempt must not fail with it (the batch would roll back and the
    job come back forever)."""
    ran: list[int] = []

    @box.task(key="odd/{n}", retry=Retry(max_attempts=1))
    def odd(ctx, n: int) -> None:
        ran.append(n)
        if n == 1:
            raise ValueError("cannot open b'\\xff.csv' (\udcff.csv)\x00")

    box.enqueue_many(odd, [{"n": 1}, {"n": 2}])
    result = drain(box, raise_on_failure=False)
    assert (result.dead, result.completed) == (1, 1)
    [job] = box.find("odd/1")
    assert job.state == "dead"
    assert job.last_error is not None and "(\\udcff.csv)\\0" in job.last_error
