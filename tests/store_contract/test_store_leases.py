"""Leases, operation by operation, on every store: a consumer session leases due jobs under one
token, settles them fenced on it, gives them back; heartbeats extend live leases; the rescuer
takes back leases whose deadline passed. Deadlines are crossed on the store's clock."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncebox.store.params import IntentClaim, JobFinish, JobReleaseParams
from oncebox.store.protocol import Store
from support.contract import (
    LEASE,
    SETTINGS,
    T0,
    advance,
    insert,
    lease,
    lease_params,
    new_token,
    opened_session,
    row,
)


def test_a_consumer_session_speaks_its_stores_dialect(store: Store):
    session = store.consumer_session(SETTINGS)
    try:
        assert session.dialect == store.dialect
        assert session.job_lease(lease_params()) == []
    finally:
        session.close()


def test_job_lease_takes_due_ready_jobs_of_its_tasks_and_queues_by_priority_then_age(
    store: Store,
):
    low = insert(store, "k/low", priority=0)
    high = insert(store, "k/high", priority=9)
    advance(store, timedelta(seconds=1))
    low_later = insert(store, "k/low-later", priority=0)
    insert(store, "k/later", delay=timedelta(minutes=1))
    insert(store, "k/other-task", "u")
    insert(store, "k/other-queue", queue="q")
    now = T0 + timedelta(seconds=1)
    with opened_session(store) as session:
        wanted = lease_params(limit=10, worker="w7")
        leased = session.job_lease(wanted)
        assert [j.id for j in leased] == [high, low, low_later]
        assert [(j.attempt, j.leased_at, j.task) for j in leased] == [(1, now, "t")] * 3
        assert {row(store, j.id).queue for j in leased} == {"default"}
        got = row(store, high)
        assert (got.state, got.attempt, got.leased_by) == ("leased", 1, "w7")
        assert (got.leased_at, got.lease_expires_at) == (now, now + LEASE)
        assert session.job_lease(lease_params()) == []  # nothing due is left ready
    assert store.job_count_by_state().counts == {"leased": 3, "ready": 3}


def test_job_lease_takes_at_most_its_limit(store: Store):
    ids = [insert(store, f"k/{n}") for n in range(5)]
    with opened_session(store) as session:
        assert [j.id for j in session.job_lease(lease_params(limit=2))] == ids[:2]
        assert [j.id for j in session.job_lease(lease_params(limit=2))] == ids[2:4]
    assert store.job_count_by_state().counts == {"leased": 4, "ready": 1}


def test_job_lease_takes_one_job_of_a_group_at_a_time_in_enqueue_order(store: Store):
    first = insert(store, "k/1", group_key="customer-1")
    second = insert(store, "k/2", group_key="customer-1")
    other = insert(store, "k/3", group_key="customer-2")
    with opened_session(store) as session:
        token, ids = lease(session)
        assert ids == [first, other]
        assert session.job_lease(lease_params()) == []  # the group's first job is leased
        with session.transaction() as tx:
            tx.job_finish(token, [JobFinish(first, "done", outcome="completed")])
        _token, ids = lease(session)
        assert ids == [second]


def test_due_seen_is_the_next_due_time_read_by_a_lease_that_came_back_short_once(store: Store):
    due = insert(store, "k/now")
    insert(store, "k/later", delay=timedelta(minutes=5))
    with opened_session(store) as session:
        _token, ids = lease(session, limit=10)
        assert ids == [due]
        seen = session.due_seen()
        assert seen is not None and (seen.at, seen.now) == (T0 + timedelta(minutes=5), T0)
        assert session.due_seen() is None  # taken once


def test_job_release_gives_leased_jobs_back_unspent_and_is_fenced_on_token_and_attempt(
    store: Store,
):
    kept = insert(store, "k/1")
    given_back = insert(store, "k/2")
    with opened_session(store) as session:
        token, ids = lease(session)
        assert ids == [kept, given_back]
        for wrong in (
            JobReleaseParams(jobs=[(given_back, 1)], token=new_token()),
            JobReleaseParams(jobs=[(given_back, 2)], token=token),  # not the attempt it took
        ):
            assert session.job_release(wrong) == 0
        assert row(store, given_back).state == "leased"
        released = JobReleaseParams(jobs=[(given_back, 1)], token=token, delay=timedelta(seconds=7))
        assert session.job_release(released) == 1
    back = row(store, given_back)
    assert (back.state, back.attempt, back.lease_expires_at) == ("ready", 0, None)
    assert back.run_at == T0 + timedelta(seconds=7)
    assert row(store, kept).state == "leased"


def test_job_finish_is_fenced_on_the_lease_token(store: Store):
    job_id = insert(store, "k/1")
    with opened_session(store) as session:
        token, _ids = lease(session)
        with session.transaction() as tx:
            done = JobFinish(job_id, "done", outcome="completed")
            assert tx.job_finish(new_token(), [done]) == set()
        assert row(store, job_id).state == "leased"
        advance(store, timedelta(seconds=3))
        with session.transaction() as tx:
            assert tx.job_finish(token, [done]) == {job_id}
            assert tx.job_finish(token, [done]) == set()  # the lease ended with the first
    finished = row(store, job_id)
    assert (finished.state, finished.outcome, finished.finished_at) == (
        "done",
        "completed",
        T0 + timedelta(seconds=3),
    )
    assert finished.lease_expires_at is None
    assert store.job_attempt_list(job_id) == []  # a completion is no failed attempt


def test_job_finish_retries_later_or_kills_with_the_error_recorded(store: Store):
    retried = insert(store, "k/1")
    killed = insert(store, "k/2")
    with opened_session(store) as session:
        token, _ids = lease(session)
        with session.transaction() as tx:
            settled = tx.job_finish(
                token,
                [
                    JobFinish(retried, "ready", delay=timedelta(minutes=2), error="timeout"),
                    JobFinish(killed, "dead", error="invalid recipient"),
                ],
            )
        assert settled == {retried, killed}
    again = row(store, retried)
    assert (again.state, again.run_at, again.last_error, again.finished_at) == (
        "ready",
        T0 + timedelta(minutes=2),
        "timeout",
        None,
    )
    dead = row(store, killed)
    assert (dead.state, dead.finished_at, dead.last_error) == ("dead", T0, "invalid recipient")
    assert [(a.outcome, a.error) for a in store.job_attempt_list(retried)] == [
        ("failed", "timeout")
    ]
    assert [(a.outcome, a.error) for a in store.job_attempt_list(killed)] == [
        ("dead", "invalid recipient")
    ]


def test_a_consumer_transaction_commits_on_exit_and_rolls_back_on_an_error(store: Store):
    job_id = insert(store, "k/1")
    with opened_session(store) as session:
        token, _ids = lease(session)
        with pytest.raises(RuntimeError, match="handler blew up"), session.transaction() as tx:
            tx.intent_claim([IntentClaim("k/1", "t", job_id)])
            tx.job_finish(token, [JobFinish(job_id, "done", outcome="completed")])
            raise RuntimeError("handler blew up")
        assert (store.intent_get("k/1"), row(store, job_id).state) == (None, "leased")
        with session.transaction() as tx:
            tx.intent_claim([IntentClaim("k/1", "t", job_id)])
            tx.job_finish(token, [JobFinish(job_id, "done", outcome="completed")])
    claimed = store.intent_get("k/1")
    assert claimed is not None and claimed.job_id == job_id
    assert row(store, job_id).state == "done"


def test_closing_a_consumer_session_leaves_its_leases_to_run_out(store: Store):
    job_id = insert(store, "k/1")
    session = store.consumer_session(SETTINGS)
    _token, ids = lease(session)
    session.close()
    assert ids == [job_id]
    assert row(store, job_id).state == "leased"
    with opened_session(store) as other:
        assert other.job_lease(lease_params()) == []


def test_job_lease_extend_pushes_live_deadlines_out_never_in(store: Store):
    job_id = insert(store, "k/1")
    other = insert(store, "k/2", "u")
    with opened_session(store) as session:
        token, _ids = lease(session, lease_for=timedelta(minutes=5))
        other_token, _ = lease(session, tasks=("u",))
        advance(store, timedelta(minutes=1))
        assert store.job_lease_extend([token], timedelta(minutes=10)) == 1
        assert row(store, job_id).lease_expires_at == T0 + timedelta(minutes=11)
        assert row(store, other).lease_expires_at == T0 + LEASE  # not its token
        assert store.job_lease_extend([token], timedelta(seconds=1)) == 1  # never earlier
        assert row(store, job_id).lease_expires_at == T0 + timedelta(minutes=11)
        with session.transaction() as tx:
            tx.job_finish(token, [JobFinish(job_id, "done", outcome="completed")])
        assert store.job_lease_extend([token, other_token], timedelta(minutes=10)) == 1
    assert row(store, job_id).lease_expires_at is None  # an ended lease is not revived
    assert row(store, other).lease_expires_at == T0 + timedelta(minutes=11)


def test_job_rescue_expired_takes_back_leases_past_their_deadline(store: Store):
    job_id = insert(store, "k/1", max_attempts=3)
    with opened_session(store) as session:
        _token, _ids = lease(session, worker="w1")
    assert store.job_rescue_expired(limit=10) == []  # not yet
    advance(store, LEASE)
    assert store.job_rescue_expired(limit=10) == []  # the deadline itself is still the lease's
    advance(store, timedelta(microseconds=1))
    [rescued] = store.job_rescue_expired(limit=10)
    assert (rescued.id, rescued.key, rescued.task, rescued.state, rescued.attempt) == (
        job_id,
        "k/1",
        "t",
        "ready",
        1,
    )
    assert rescued.worker == "w1"
    back = row(store, job_id)
    assert (back.state, back.attempt, back.lease_expires_at) == ("ready", 1, None)
    assert back.last_error == (
        "lease expired: w1 did not finish attempt 1 before its lease ended at 2026-08-17T09:00:30Z"
    )
    [attempt] = store.job_attempt_list(job_id)
    assert (attempt.attempt, attempt.worker, attempt.outcome) == (1, "w1", "lease_expired")


def test_job_rescue_expired_kills_a_job_whose_attempts_are_spent(store: Store):
    job_id = insert(store, "k/1", max_attempts=1)
    with opened_session(store) as session:
        lease(session)
    later = advance(store, timedelta(hours=1))
    [rescued] = store.job_rescue_expired(limit=10)
    assert (rescued.id, rescued.state) == (job_id, "dead")
    dead = row(store, job_id)
    assert (dead.state, dead.finished_at) == ("dead", later)


def test_job_rescue_expired_takes_at_most_its_limit_earliest_deadline_first(store: Store):
    ids = [insert(store, f"k/{n}") for n in range(3)]
    with opened_session(store) as session:
        for n, job_id in enumerate(ids):
            _token, leased = lease(session, limit=1, lease_for=timedelta(minutes=3 - n))
            assert leased == [job_id]
    advance(store, timedelta(hours=1))
    assert {r.id for r in store.job_rescue_expired(limit=2)} == {ids[2], ids[1]}
    assert [r.id for r in store.job_rescue_expired(limit=2)] == [ids[0]]
