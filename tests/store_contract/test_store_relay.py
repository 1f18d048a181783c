"""The job records of a broker-held queue (migration 0016), on every store: on PostgreSQL a job
written `relayed` gets its publish in the outbox in the same statement, the broker consumer's
read tells a current delivery from a stale copy, its settlement is fenced on the attempt, a retry
publishes the next attempt when due, and ready jobs of a broker-held queue are handed to the
relay; a group's jobs are published one at a time. SQLite refuses each operation in one line."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from oncebox.kernel.clock import ClockSetting
from oncebox.kernel.errors import ConfigurationError
from oncebox.store import open_store
from oncebox.store.params import JobFilter, OperatorAction, RelayedFinish
from oncebox.store.protocol import Store
from store_contract.conftest import emptied
from support.contract import T0, advance, insert, opened_session, row
from support.depths import depth_drift
from support.waiting import wait_until


def publishes(store: Store, job_id: int) -> list[tuple[str, str]]:
    """The relay's outbox rows of a job: (key, state)."""
    return [(m.key, m.state) for m in store.outbox_find_by_key(f"~relay/{job_id}")]


def finish(job_id: int, run: int, state: str = "done", **fields: Any) -> RelayedFinish:
    return RelayedFinish(
        id=job_id,
        run=run,
        state=state,  # type: ignore[arg-type]
        outcome=fields.get("outcome", "completed" if state == "done" else None),
        delay=fields.get("delay", timedelta(0)),
        error=fields.get("error"),
        worker="w1",
        started_at=T0,
    )


def settle(store: Store, job_id: int, run: int, state: str = "done", **fields: Any) -> set[int]:
    with opened_session(store) as session, session.transaction() as tx:
        return tx.job_settle_relayed([finish(job_id, run, state, **fields)])


def test_sqlite_refuses_the_relay_in_one_line(tmp_path: Path):
    store = open_store(f"sqlite:///{tmp_path / 'oncebox.db'}")
    try:
        with pytest.raises(ConfigurationError, match="keeps its jobs' records on PostgreSQL"):
            store.job_relay_check([1])
        with pytest.raises(ConfigurationError, match="on PostgreSQL"):
            store.job_relay_adopt(["events"], ["t"], 10)
        with pytest.raises(ConfigurationError, match="on PostgreSQL"):
            store.job_bury_relayed([finish(1, 1, "dead")])
        with (
            opened_session(store) as session,
            session.transaction() as tx,
            pytest.raises(ConfigurationError, match="on PostgreSQL"),
        ):
            tx.job_settle_relayed([])
    finally:
        store.close()


@pytest.fixture
def pg(pg_contract_url: str) -> Iterator[Store]:
    """The contract's PostgreSQL store (the relay is PostgreSQL's: 0016), emptied, its clock
    frozen at T0; the depths checked against the rows afterwards, as for every contract test."""
    url = emptied(pg_contract_url)
    opened = open_store(url)
    opened.clock_set(ClockSetting(frozen_at=T0))
    try:
        yield opened
        assert depth_drift(url) == {}, "the depths drifted from the rows"
    finally:
        opened.close()


@pytest.mark.postgres
def test_a_relayed_job_is_written_with_its_first_publish_due_at_its_run_time(pg: Store):
    job_id = insert(pg, "k/1", queue="events", relayed=True, delay=timedelta(minutes=5))
    assert row(pg, job_id).state == "relayed"
    [publish] = pg.outbox_find_by_key(f"~relay/{job_id}/1")
    assert (publish.channel, publish.state) == ("~broker.events", "pending")
    assert publish.next_attempt_at == T0 + timedelta(minutes=5)
    plain = insert(pg, "k/2", queue="default")
    assert row(pg, plain).state == "ready" and publishes(pg, plain) == []


@pytest.mark.postgres
def test_the_check_reads_what_tells_a_current_delivery_from_a_stale_copy(pg: Store):
    job_id = insert(pg, "k/1", queue="events", relayed=True)
    [checked] = pg.job_relay_check([job_id, 999]).values()
    assert (checked.id, checked.state, checked.attempt, checked.key) == (
        job_id,
        "relayed",
        0,
        "k/1",
    )
    assert settle(pg, job_id, run=1) == {job_id}
    assert pg.job_relay_check([job_id])[job_id].state == "done"


@pytest.mark.postgres
def test_a_settlement_is_fenced_on_the_attempt_delivered(pg: Store):
    job_id = insert(pg, "k/1", queue="events", relayed=True)
    assert settle(pg, job_id, run=2) == set()  # a copy of an attempt not yet due
    assert settle(pg, job_id, run=1, outcome="completed") == {job_id}
    assert settle(pg, job_id, run=1, outcome="duplicate") == set()  # the second copy
    done = row(pg, job_id)
    assert (done.state, done.outcome, done.attempt) == ("done", "completed", 1)
    assert pg.counter_list()["jobs_completed"] == 1


@pytest.mark.postgres
def test_a_job_its_broker_gave_up_on_is_buried_dead_fenced_on_its_attempt(pg: Store):
    job_id = insert(pg, "k/1", queue="events", relayed=True)
    why = "SQS gave it up after 20 deliveries, none settled"
    assert pg.job_bury_relayed([finish(job_id, 2, "dead", error=why)]) == set()  # not yet due
    assert pg.job_bury_relayed([finish(job_id, 1, "dead", error=why)]) == {job_id}
    assert pg.job_bury_relayed([finish(job_id, 1, "dead", error=why)]) == set()  # swept twice
    dead = row(pg, job_id)
    assert (dead.state, dead.attempt, dead.last_error) == ("dead", 1, why)
    assert pg.counter_list()["jobs_dead"] == 1
    assert [j.key for j in pg.job_list(JobFilter(state="dead"))] == ["k/1"]


@pytest.mark.postgres
def test_a_failed_attempt_is_recorded_and_its_next_attempt_published_when_due(pg: Store):
    job_id = insert(pg, "k/1", queue="events", relayed=True)
    delay = timedelta(seconds=30)
    assert settle(pg, job_id, run=1, state="ready", delay=delay, error="busy") == {job_id}
    again = row(pg, job_id)
    assert (again.state, again.attempt, again.run_at) == ("relayed", 1, T0 + delay)
    assert [(a.attempt, a.outcome, a.error) for a in pg.job_attempt_list(job_id)] == [
        (1, "failed", "busy")
    ]
    [second] = pg.outbox_find_by_key(f"~relay/{job_id}/2")
    assert (second.state, second.next_attempt_at) == ("pending", T0 + delay)
    assert settle(pg, job_id, run=2, state="dead", error="gone") == {job_id}
    assert row(pg, job_id).state == "dead"
    assert pg.counter_list()["jobs_retried"] == 1 and pg.counter_list()["jobs_dead"] == 1


@pytest.mark.postgres
def test_ready_jobs_of_a_broker_held_queue_are_handed_to_the_relay(pg: Store):
    """A replayed dead letter comes back ready; the adopt makes it relayed, which publishes
    its next attempt. Jobs of other queues, and a table queue's, are left alone."""
    job_id = insert(pg, "k/1", queue="events", relayed=True)
    settle(pg, job_id, run=1, state="dead", error="gone")
    replayed = pg.job_replay(OperatorAction(job_id, "tester", "fixed"))
    assert replayed is not None and row(pg, job_id).state == "ready"
    other = insert(pg, "k/2", queue="default")
    advance(pg, timedelta(seconds=1))
    assert pg.job_relay_adopt(["events"], ["t"], 10) == 1
    assert row(pg, job_id).state == "relayed" and row(pg, other).state == "ready"
    assert ("~relay/" + str(job_id) + "/2", "pending") in publishes(pg, job_id)
    assert pg.job_relay_adopt(["events"], ["t"], 10) == 0


@pytest.mark.postgres
def test_a_groups_jobs_are_published_one_at_a_time_in_order(pg: Store):
    first, second, third = (
        insert(pg, f"k/{n}", queue="events", relayed=True, group_key="shipment-1") for n in range(3)
    )
    loner = insert(pg, "k/other", queue="events", relayed=True, group_key="shipment-2")
    assert [bool(publishes(pg, j)) for j in (first, second, third, loner)] == [
        True,
        False,
        False,
        True,
    ]
    settle(pg, first, run=1)
    assert publishes(pg, second) == [(f"~relay/{second}/1", "pending")]
    assert publishes(pg, third) == []
    cancelled = pg.job_cancel(OperatorAction(second, "tester", "not needed"))
    assert cancelled is not None
    assert publishes(pg, third) == [(f"~relay/{third}/1", "pending")]


def _waiting_on_a_group_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.postgres
def test_a_head_settled_while_the_next_job_is_enqueued_still_gets_that_job_published(pg: Store):
    """Each transaction alone would miss the other's uncommitted row: the settle sees no next
    job, the enqueue sees the head still relayed. The group's lock makes the second decide after
    the first committed, so the new head is published."""
    head = insert(pg, "k/0", queue="events", relayed=True, group_key="shipment-1")
    enqueued: list[int] = []
    with opened_session(pg) as session:
        with session.transaction() as tx:
            assert tx.job_settle_relayed([finish(head, 1)]) == {head}
            racer = threading.Thread(
                target=lambda: enqueued.append(
                    insert(pg, "k/1", queue="events", relayed=True, group_key="shipment-1")
                )
            )
            racer.start()
            # the enqueue waits for the group's lock (without it, it commits unpublished)
            wait_until(
                lambda: _waiting_on_a_group_lock(pg.url) or not racer.is_alive(),
                what="the enqueue to wait on the group's lock, or to finish",
            )
        racer.join(timeout=30)
    [second] = enqueued
    assert publishes(pg, second) == [(f"~relay/{second}/1", "pending")]
