"""Jobs, operation by operation, on every store: insert and its dedupe, reads and listings,
operator actions (cancel, replay) with their audit rows, attempts, pruning."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.store.params import IntentClaim, JobFilter, JobFinish, JobInsertMany, OperatorAction
from oncebox.store.protocol import Store
from oncebox.store.records import EnqueueConflict
from support.contract import (
    T0,
    advance,
    dead_job,
    done_job,
    insert,
    job,
    lease,
    opened_session,
    row,
    settle,
)


def test_job_insert_writes_a_ready_job_with_its_fields_due_after_its_delay(store: Store):
    wanted = job(
        "k/1",
        "mail",
        queue="q",
        args={"n": 1, "note": "é"},
        priority=5,
        group_key="g",
        max_attempts=4,
        delay=timedelta(minutes=1),
        max_age=timedelta(hours=1),
    )
    job_id, created = store.job_insert(wanted)
    assert created and job_id > 0
    got = row(store, job_id)
    assert (got.key, got.task, got.queue, got.priority, got.group_key) == (
        "k/1",
        "mail",
        "q",
        5,
        "g",
    )
    assert json.loads(got.args_json) == {"n": 1, "note": "é"}
    assert (got.state, got.outcome, got.attempt, got.max_attempts, got.attempt_base) == (
        "ready",
        None,
        0,
        4,
        0,
    )
    assert (got.created_at, got.run_at, got.expires_at) == (
        T0,
        T0 + timedelta(minutes=1),
        T0 + timedelta(hours=1),
    )
    assert (got.leased_by, got.leased_at, got.lease_expires_at, got.finished_at) == (None,) * 4
    assert (got.last_error, got.schedule, got.period) == (None, None, None)


def test_job_insert_takes_an_explicit_run_at_over_the_delay(store: Store):
    at = T0 + timedelta(days=3)
    job_id, _created = store.job_insert(job(run_at=at, delay=timedelta(seconds=5)))
    assert row(store, job_id).run_at == at


def test_job_insert_of_an_active_key_writes_nothing_and_the_conflict_names_the_job(store: Store):
    first = insert(store, "k/1")
    assert store.job_insert(job("k/1", args={"n": 2})) == (0, False)
    assert store.job_count_by_state().counts == {"ready": 1}
    assert json.loads(row(store, first).args_json) == {"n": 1}  # the first job is untouched
    conflict = store.job_enqueue_conflict("k/1")
    assert conflict == EnqueueConflict(first, "ready", None, None)
    assert conflict.found


def test_job_enqueue_conflict_of_a_free_key_finds_nothing(store: Store):
    insert(store, "k/1")
    conflict = store.job_enqueue_conflict("k/other")
    assert conflict == EnqueueConflict(None, None, None, None)
    assert not conflict.found


def test_job_insert_of_a_claimed_key_writes_nothing_and_the_conflict_names_the_intent(
    store: Store,
):
    with opened_session(store) as session, session.transaction() as tx:
        assert tx.intent_claim([IntentClaim("k/1", "t", None)]) == {"k/1"}  # a broker delivery
    advance(store, timedelta(minutes=5))
    assert store.job_insert(job("k/1")) == (0, False)
    assert store.job_find_by_key("k/1") == []
    assert store.job_enqueue_conflict("k/1") == EnqueueConflict(None, None, None, T0)


def test_a_cancelled_key_can_be_enqueued_again_and_find_by_key_skips_the_cancelled_job(
    store: Store,
):
    first = insert(store, "k/1")
    cancelled = store.job_cancel(OperatorAction(first, "ops", "wrong customer"))
    assert cancelled is not None and (cancelled.job_id, cancelled.key) == (first, "k/1")
    second = insert(store, "k/1")
    assert second != first
    assert [j.id for j in store.job_find_by_key("k/1")] == [second]
    assert row(store, first).state == "cancelled"


def test_keyless_jobs_are_never_deduplicated(store: Store):
    ids = [store.job_insert(job(None)) for _ in range(2)]
    assert [created for _id, created in ids] == [True, True]
    assert ids[0][0] != ids[1][0]
    assert store.job_count_by_state()["ready"] == 2


def test_job_insert_many_inserts_one_set_and_skips_taken_keys(store: Store):
    taken = insert(store, "k/2")
    rows = [
        ("k/1", json.dumps({"n": 1}), None, None),
        ("k/2", json.dumps({"n": 2}), None, None),
        (None, json.dumps({"n": 3}), "g", None),
        ("k/1", json.dumps({"n": 4}), None, None),  # the same key twice in one set: the first wins
    ]
    result = store.job_insert_many(
        JobInsertMany(task="t", queue="q", priority=1, max_attempts=2, rows=iter(rows))
    )
    assert result.offered == 4 and result.run_held
    created = sorted(result.created)  # ids in the order of the rows
    assert [key for _id, key in created] == ["k/1", None]
    by_id = {job_id: row(store, job_id) for job_id, _key in created}
    assert [json.loads(r.args_json) for r in by_id.values()] == [{"n": 1}, {"n": 3}]
    assert {(r.task, r.queue, r.priority, r.max_attempts, r.state) for r in by_id.values()} == {
        ("t", "q", 1, 2, "ready")
    }
    assert [r.group_key for r in by_id.values()] == [None, "g"]
    assert [j.id for j in store.job_find_by_key("k/2")] == [taken]
    assert store.job_count_by_state()["ready"] == 3


def test_job_get_of_an_unknown_id_is_none(store: Store):
    insert(store)
    assert store.job_get(10**9) is None


def test_job_find_by_key_also_finds_the_job_whose_intent_holds_the_key(store: Store):
    """A broker delivery claims its key for a job recorded under another key (or none)."""
    carrier = insert(store, None)
    with opened_session(store) as session, session.transaction() as tx:
        tx.intent_claim([IntentClaim("k/broker", "t", carrier)])
    assert [j.id for j in store.job_find_by_key("k/broker")] == [carrier]
    assert store.job_find_by_key("k/none") == []


def test_job_count_by_state_counts_each_state_and_done_jobs_by_outcome(store: Store):
    insert(store, "k/ready", "waits")
    done_job(store, "k/done")
    dead_job(store, "k/dead")
    counts = store.job_count_by_state()
    assert counts.counts == {"ready": 1, "done": 1, "done:completed": 1, "dead": 1}
    assert (counts["leased"], counts["cancelled"]) == (0, 0)


def test_job_list_is_newest_first_filtered_and_paged_by_id(store: Store):
    a = insert(store, "k/a", "t", queue="q1")
    b = insert(store, "k/b", "u", queue="q1")
    c = insert(store, "k/c", "t", queue="q2")
    dead = dead_job(store, "k/d", "t")
    assert [j.id for j in store.job_list(JobFilter())] == [dead, c, b, a]
    assert [j.id for j in store.job_list(JobFilter(task="t"))] == [dead, c, a]
    assert [j.id for j in store.job_list(JobFilter(queue="q1"))] == [b, a]
    assert [j.id for j in store.job_list(JobFilter(state="dead"))] == [dead]
    assert [j.id for j in store.job_list(JobFilter(before_id=c))] == [b, a]
    assert [j.id for j in store.job_list(JobFilter(limit=2))] == [dead, c]
    assert store.job_list(JobFilter(schedule="none")) == []


def test_job_next_due_is_the_earliest_ready_job_of_the_tasks_and_queues_asked(store: Store):
    insert(store, "k/1", "t", delay=timedelta(minutes=10))
    insert(store, "k/2", "t", delay=timedelta(minutes=5), queue="other")
    insert(store, "k/3", "u", delay=timedelta(minutes=1))
    due = store.job_next_due(["t"], ["default"])
    assert (due.at, due.now, due.seconds()) == (T0 + timedelta(minutes=10), T0, 600.0)
    assert store.job_next_due(["t", "u"], ["default", "other"]).at == T0 + timedelta(minutes=1)
    nothing = store.job_next_due(["nobody"], ["default"])
    assert (nothing.at, nothing.now, nothing.seconds()) == (None, T0, None)


def test_job_cancel_withdraws_a_ready_job_once_and_audits_it(store: Store):
    job_id = insert(store, "k/1", "t")
    advance(store, timedelta(minutes=2))
    result = store.job_cancel(OperatorAction(job_id, "ops-alice", "customer left"))
    assert result is not None and (result.job_id, result.key) == (job_id, "k/1")
    cancelled = row(store, job_id)
    assert (cancelled.state, cancelled.finished_at) == ("cancelled", T0 + timedelta(minutes=2))
    [audit] = store.audit_list(job_id)
    assert audit.id == result.audit_id
    assert (audit.action, audit.actor, audit.reason) == ("cancel", "ops-alice", "customer left")
    assert (audit.target_kind, audit.target_key, audit.at) == (
        "job",
        "k/1",
        T0 + timedelta(minutes=2),
    )
    assert json.loads(audit.details or "{}") == {"task": "t"}
    assert store.job_cancel(OperatorAction(job_id, "ops", "again")) is None
    assert len(store.audit_list(job_id)) == 1


def test_job_cancel_leaves_a_job_that_is_not_ready(store: Store):
    job_id = insert(store)
    with opened_session(store) as session:
        _token, ids = lease(session)
        assert ids == [job_id]
        assert store.job_cancel(OperatorAction(job_id, "ops", "too late")) is None
    assert row(store, job_id).state == "leased"
    assert store.audit_list(job_id) == []


def test_job_replay_makes_a_dead_job_ready_in_place_with_a_fresh_budget_and_audits_it(
    store: Store,
):
    job_id = dead_job(store, "k/1")
    advance(store, timedelta(hours=1))
    result = store.job_replay(OperatorAction(job_id, "ops-bob", "provider fixed"))
    assert result is not None and (result.job_id, result.key) == (job_id, "k/1")
    replayed = row(store, job_id)
    assert (replayed.state, replayed.attempt, replayed.attempt_base) == ("ready", 1, 1)
    assert (replayed.run_at, replayed.finished_at) == (T0 + timedelta(hours=1), None)
    [audit] = store.audit_list(job_id)
    assert audit.id == result.audit_id
    assert (audit.action, audit.actor, audit.reason) == ("replay", "ops-bob", "provider fixed")
    assert json.loads(audit.details or "{}") == {"task": "t", "attempts_before": 1}
    assert store.job_replay(OperatorAction(job_id, "ops", "again")) is None  # ready, not dead
    assert len(store.audit_list(job_id)) == 1


def test_job_attempt_list_records_each_failed_attempt_in_order(store: Store):
    job_id = insert(store, "k/1", max_attempts=3)
    settle(store, job_id, JobFinish(job_id, "ready", error="first"))
    settle(store, job_id, JobFinish(job_id, "dead", error="second"))
    attempts = store.job_attempt_list(job_id)
    assert [(a.job_id, a.attempt, a.worker, a.outcome, a.error, a.note) for a in attempts] == [
        (job_id, 1, "w1", "failed", "first", None),
        (job_id, 2, "w1", "dead", "second", None),
    ]
    assert all(a.started_at == a.finished_at == T0 for a in attempts)
    assert store.job_attempt_list(10**9) == []


def test_job_attempt_note_adds_a_superseded_attempt_or_appends_to_a_recorded_one(store: Store):
    job_id = insert(store, "k/1")
    settle(store, job_id, JobFinish(job_id, "ready", error="failed once"))
    store.job_attempt_note(job_id, 1, "w9", "commit refused: lease lost")
    store.job_attempt_note(job_id, 2, "w9", "commit refused: lease lost")
    store.job_attempt_note(job_id, 2, "w9", "again")
    first, second = store.job_attempt_list(job_id)
    assert (first.outcome, first.error, first.note) == (
        "failed",
        "failed once",
        "commit refused: lease lost",
    )
    assert (second.attempt, second.worker, second.outcome, second.started_at) == (
        2,
        "w9",
        "superseded",
        None,
    )
    assert second.note == "commit refused: lease lost; again"


def test_job_prune_deletes_finished_jobs_older_than_asked_with_their_attempts(store: Store):
    old_done = done_job(store, "k/old")
    old_cancelled = insert(store, "k/cancelled")
    store.job_cancel(OperatorAction(old_cancelled, "ops", "r"))
    old_dead = dead_job(store, "k/dead")
    failed_then_done = insert(store, "k/retried")
    settle(store, failed_then_done, JobFinish(failed_then_done, "ready", error="once"))
    settle(store, failed_then_done, JobFinish(failed_then_done, "done", outcome="completed"))
    advance(store, timedelta(days=8))
    young = done_job(store, "k/young")
    waiting = insert(store, "k/waiting")
    assert store.job_prune("t", timedelta(days=7), limit=2) == 2
    assert store.job_prune("t", timedelta(days=7), limit=100) == 1
    assert store.job_prune("t", timedelta(days=7), limit=100) == 0
    for gone in (old_done, old_cancelled, failed_then_done):
        assert store.job_get(gone) is None
    assert store.job_attempt_list(failed_then_done) == []
    assert [row(store, j).state for j in (old_dead, young, waiting)] == ["dead", "done", "ready"]
