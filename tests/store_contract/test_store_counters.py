"""Durable counters, on every store: what happened, counted in the transaction that did it —
an enqueue and a duplicate held off by its key, a settled job by what it became, a rescued
lease, a delivery attempt by its outcome — and nothing for what did not commit (a superseded
lease settles nothing and counts nothing). Summed over shards on read; they outlive the rows."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from oncebox.outbox import transitions
from oncebox.outbox.transitions import OutboxFinish
from oncebox.store import open_store
from oncebox.store.params import JobFinish, JobInsertMany, OperatorAction
from oncebox.store.protocol import Store
from support.contract import (
    LEASE,
    advance,
    finish_outbox,
    insert,
    job,
    lease,
    message,
    new_token,
    opened_session,
    outbox_insert,
    write_outbox,
)
from support.waiting import wait_until


def test_counter_add_adds_and_counter_list_sums(store: Store):
    assert store.counter_list() == {}
    store.counter_add({"channel_pauses": 2})
    store.counter_add({"channel_pauses": 3, "rate_limit_waits": 1, "unused": 0})
    assert store.counter_list() == {"channel_pauses": 5, "rate_limit_waits": 1}


def test_an_enqueue_counts_a_created_job_or_a_duplicate_held_off(store: Store):
    assert store.job_insert(job("k/1"))[1] is True
    assert store.job_insert(job("k/1"))[1] is False
    store.job_insert_many(
        JobInsertMany(
            task="t",
            queue="default",
            priority=0,
            max_attempts=3,
            rows=[
                ("k/1", '{"n": 1}', None, None),
                ("k/2", '{"n": 2}', None, None),
                (None, "{}", None, None),
            ],
        )
    )
    assert store.counter_list() == {"jobs_enqueued": 3, "enqueue_duplicates": 2}


def test_settling_counts_each_job_by_what_it_became_and_only_once(store: Store):
    ids = [insert(store, f"k/{n}") for n in range(4)]
    with opened_session(store) as session:
        token, leased = lease(session, limit=4)
        assert sorted(leased) == sorted(ids)
        finishes = [
            JobFinish(ids[0], "done", outcome="completed"),
            JobFinish(ids[1], "done", outcome="duplicate"),
            JobFinish(ids[2], "ready", delay=timedelta(minutes=1), error="timeout"),
            JobFinish(ids[3], "dead", error="invalid"),
        ]
        with session.transaction() as tx:
            assert tx.job_finish(token, finishes) == set(ids)
        with session.transaction() as tx:  # the lease has ended: nothing settles, nothing counts
            assert tx.job_finish(token, finishes) == set()
        with session.transaction() as tx:
            assert tx.job_finish(new_token(), finishes) == set()
    counts = store.counter_list()
    assert {name: counts.get(name) for name in ("jobs_completed", "claim_conflicts")} == {
        "jobs_completed": 1,
        "claim_conflicts": 1,
    }
    assert (counts["jobs_retried"], counts["jobs_dead"]) == (1, 1)


def test_a_rolled_back_settlement_counts_nothing(store: Store):
    job_id = insert(store, "k/1")
    with opened_session(store) as session:
        token, _ = lease(session)
        try:
            with session.transaction() as tx:
                tx.job_finish(token, [JobFinish(job_id, "done", outcome="completed")])
                raise RuntimeError("the handler's batch failed at the end")
        except RuntimeError:
            pass
    assert "jobs_completed" not in store.counter_list()


def test_a_rescued_lease_counts_and_its_last_attempt_counts_dead(store: Store):
    insert(store, "k/1", max_attempts=1)
    insert(store, "k/2", max_attempts=3)
    with opened_session(store) as session:
        lease(session, limit=2)
    advance(store, LEASE + timedelta(seconds=1))
    assert len(store.job_rescue_expired(10)) == 2
    counts = store.counter_list()
    assert (counts["leases_expired"], counts["jobs_dead"]) == (2, 1)


ID = 0  # replaced by the written row's id


@pytest.mark.parametrize(
    ("finish", "counted"),
    [
        (transitions.sent(ID, "r1"), {"sends_sent"}),
        (transitions.retry(ID, timedelta(0), "451"), {"sends_retried"}),
        (transitions.throttled(ID, timedelta(0), "429"), {"sends_throttled"}),
        (transitions.dead(ID, "550"), {"sends_dead"}),
        (transitions.hold_ambiguous(ID, "lost ack"), {"sends_ambiguous"}),
        (transitions.hold_past_window(ID, "window passed"), {"sends_ambiguous"}),
        (transitions.resend_same_key(ID, timedelta(0), "lost ack"), {"sends_resent"}),
        (
            transitions.resend_possible_duplicate(ID, "lost ack"),
            {"sends_resent", "sends_possible_duplicate"},
        ),
        (transitions.unsent_after_expiry(ID), {"sends_lease_expired"}),
        (transitions.resend_after_expiry(ID, "x"), {"sends_resent", "sends_lease_expired"}),
        (transitions.dead_after_rescues(ID, "x"), {"sends_dead", "sends_lease_expired"}),
        (transitions.held_after_rescues(ID, "x"), {"sends_ambiguous", "sends_lease_expired"}),
        (transitions.give_back(ID), {"sends_waited"}),
    ],
    ids=lambda value: value.outcome or value.state if isinstance(value, OutboxFinish) else "",
)
def test_each_settled_message_counts_by_what_it_became(store: Store, finish, counted):
    [row] = write_outbox(store, outbox_insert("m/1"))
    finish_outbox(store, row, dataclasses.replace(finish, id=row))
    counts = {name for name in store.counter_list() if name.startswith("sends_")}
    assert counts == counted
    assert all(store.counter_list()[name] == 1 for name in counted)


def test_a_consumer_transaction_counts_with_its_commit_or_not_at_all(store: Store):
    with opened_session(store) as session:
        with session.transaction() as tx:
            tx.counter_add({"claim_conflicts": 2, "jobs_completed": 1})
        try:
            with session.transaction() as tx:
                tx.counter_add({"jobs_completed": 5})
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
    assert store.counter_list() == {"claim_conflicts": 2, "jobs_completed": 1}


def test_a_reported_duplicate_is_audited_and_counted_only_for_a_sent_message(store: Store):
    sent, pending = write_outbox(
        store, outbox_insert("m/1", channel="a"), outbox_insert("m/2", channel="b")
    )
    finish_outbox(store, sent, OutboxFinish(sent, "sent", "sent", True, receipt="r1"))
    done = store.outbox_report_duplicate(OperatorAction(sent, "ops", "customer got two"))
    assert done is not None and (done.job_id, done.key) == (sent, "m/1")
    assert store.outbox_report_duplicate(OperatorAction(pending, "ops", "x")) is None
    [entry] = store.audit_list(limit=10)
    assert (entry.action, entry.target_kind, entry.target_id, entry.reason) == (
        "report-duplicate",
        "delivery",
        sent,
        "customer got two",
    )
    assert entry.id == done.audit_id
    assert store.counter_list()["duplicates_reported"] == 1
    assert message(store, sent).state == "sent"  # the row itself is not changed


def test_counter_compact_folds_the_shards_of_gone_connections_and_keeps_the_totals(
    store: Store,
):
    store.counter_add({"jobs_completed": 2})
    other = open_store(store.url)  # another connection, so another shard on PostgreSQL
    other.counter_add({"jobs_completed": 3, "jobs_dead": 1})
    other.close()
    totals = {"jobs_completed": 5, "jobs_dead": 1}
    assert store.counter_list() == totals
    if store.dialect == "sqlite":
        assert store.counter_compact() == 0  # one writer, one shard
    else:  # the closed connection's backend ends on its own time: its shard folds once it has
        wait_until(lambda: store.counter_compact() > 0, what="the closed backend's shard folded")
    assert store.counter_list() == totals
