"""The outbox, operation by operation, on every store: rows written in the consumer
transaction, leased per channel, marked sending, settled fenced on the lease token with their
delivery attempts, rescued when a lease runs out, resolved and replayed by an operator."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from oncebox.outbox.transitions import OutboxFinish
from oncebox.store.params import OperatorAction, OutboxFilter
from oncebox.store.protocol import Store
from oncebox.store.records import OutboxRow
from support.contract import (
    LEASE,
    T0,
    advance,
    ambiguous,
    done_job,
    finish_outbox,
    insert,
    lease_outbox,
    message,
    new_token,
    opened_session,
    outbox_insert,
    outbox_lease_params,
    row,
    write_outbox,
)


def sent(outbox_id: int, receipt: str = "provider-id-1") -> OutboxFinish:
    return OutboxFinish(outbox_id, "sent", "sent", counts_attempt=True, receipt=receipt)


def test_outbox_insert_writes_pending_rows_due_now_and_never_a_key_twice(store: Store):
    job_id = insert(store, "weekly/1")
    with opened_session(store) as session, session.transaction() as tx:
        tx.outbox_insert(
            [
                outbox_insert("weekly/1", job_id=job_id, payload={"to": ["a@b.example"]}),
                outbox_insert("weekly/1~ops", intent_key="weekly/1", channel="ops", job_id=job_id),
            ]
        )
    with opened_session(store) as session, session.transaction() as tx:
        tx.outbox_insert([outbox_insert("weekly/1", payload={"to": ["changed@b.example"]})])
    rows = store.outbox_find_by_key("weekly/1")
    assert [(r.key, r.intent_key, r.channel, r.job_id) for r in rows] == [
        ("weekly/1", "weekly/1", "email", job_id),
        ("weekly/1~ops", "weekly/1", "ops", job_id),
    ]
    first = rows[0]
    assert json.loads(first.payload_json) == {"to": ["a@b.example"]}  # not the second write
    assert (first.state, first.attempt, first.token) == ("pending", 0, "token-of-weekly/1")
    assert (first.created_at, first.next_attempt_at, first.first_leased_at) == (T0, T0, None)
    assert (first.sent_at, first.receipt, first.last_error, first.uncertain) == (
        None,
        None,
        None,
        False,
    )
    assert [r.key for r in store.outbox_find_by_key("weekly/1~ops")] == ["weekly/1~ops"]
    assert store.outbox_find_by_key("weekly/2") == []
    assert store.outbox_count_by_state().counts == {"pending": 2}


def test_outbox_get_reads_one_row_by_id(store: Store):
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    got = store.outbox_get(outbox_id)
    assert got is not None and (got.id, got.key) == (outbox_id, "k/1")
    assert store.outbox_get(outbox_id + 1000) is None


def test_outbox_lease_takes_due_pending_rows_of_its_channels_oldest_first(store: Store):
    first, second = write_outbox(store, outbox_insert("k/1"), outbox_insert("k/2"))
    write_outbox(store, outbox_insert("k/sms", channel="sms"))
    advance(store, timedelta(seconds=5))
    wanted = outbox_lease_params(channels=["email"], limit=10, worker="d7")
    leased = store.outbox_lease(wanted)
    now = T0 + timedelta(seconds=5)
    assert [(m.id, m.key, m.channel, m.lease_token) for m in leased] == [
        (first, "k/1", "email", wanted.token),
        (second, "k/2", "email", wanted.token),
    ]
    assert [(m.attempt, m.first_leased_at, m.leased_at) for m in leased] == [(0, now, now)] * 2
    assert json.loads(leased[0].payload_json) == {"to": ["a@b.example"]}
    got = message(store, first)
    assert (got.state, got.leased_by, got.lease_token) == ("leased", "d7", wanted.token)
    assert (got.lease_expires_at, got.first_leased_at) == (now + LEASE, now)
    assert store.outbox_lease(outbox_lease_params(channels=["email"])) == []
    assert store.outbox_count_by_state().counts == {"leased": 2, "pending": 1}


def test_outbox_lease_takes_at_most_its_limit_across_channels(store: Store):
    ids = write_outbox(
        store, outbox_insert("k/1"), outbox_insert("k/2", channel="ops"), outbox_insert("k/3")
    )
    leased = store.outbox_lease(outbox_lease_params(channels=["email", "ops"], limit=2))
    assert [m.id for m in leased] == ids[:2]


def test_outbox_next_due_is_the_earliest_pending_row_of_the_channels_asked(store: Store):
    [retried] = write_outbox(store, outbox_insert("k/1"))
    finish_outbox(
        store,
        retried,
        OutboxFinish(retried, "pending", "failed", True, delay=timedelta(minutes=3), error="503"),
    )
    advance(store, timedelta(minutes=1))
    write_outbox(store, outbox_insert("k/2", channel="sms"))
    due = store.outbox_next_due(["email"])
    assert (due.at, due.now) == (T0 + timedelta(minutes=3), T0 + timedelta(minutes=1))
    assert store.outbox_next_due(["email", "sms"]).at == T0 + timedelta(minutes=1)
    assert store.outbox_next_due(["ops"]).at is None


def test_outbox_mark_sending_is_fenced_on_the_lease_token(store: Store):
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    [leased] = lease_outbox(store)
    assert store.outbox_mark_sending(outbox_id, new_token()) is False
    assert message(store, outbox_id).state == "leased"
    assert store.outbox_mark_sending(outbox_id, leased.lease_token) is True
    assert message(store, outbox_id).state == "sending"
    assert store.outbox_mark_sending(outbox_id, leased.lease_token) is False  # once


def test_outbox_finish_is_fenced_on_the_lease_token(store: Store):
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    [leased] = lease_outbox(store, worker="d1")
    assert store.outbox_finish(new_token(), [sent(outbox_id)]) == set()
    assert message(store, outbox_id).state == "leased"
    assert store.delivery_attempt_list(outbox_id) == []
    advance(store, timedelta(seconds=2))
    assert store.outbox_finish(leased.lease_token, [sent(outbox_id)]) == {outbox_id}
    assert store.outbox_finish(leased.lease_token, [sent(outbox_id, "again")]) == set()
    done = message(store, outbox_id)
    assert (done.state, done.attempt, done.receipt) == ("sent", 1, "provider-id-1")
    assert (done.sent_at, done.lease_token, done.lease_expires_at) == (
        T0 + timedelta(seconds=2),
        None,
        None,
    )
    [attempt] = store.delivery_attempt_list(outbox_id)
    assert (attempt.outbox_id, attempt.attempt, attempt.worker, attempt.outcome) == (
        outbox_id,
        1,
        "d1",
        "sent",
    )
    assert (attempt.started_at, attempt.finished_at, attempt.receipt, attempt.error) == (
        T0,
        T0 + timedelta(seconds=2),
        "provider-id-1",
        None,
    )


def test_outbox_finish_retries_later_counting_the_attempt_and_keeping_the_error(store: Store):
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    finish_outbox(
        store,
        outbox_id,
        OutboxFinish(
            outbox_id,
            "pending",
            "resent",
            counts_attempt=True,
            delay=timedelta(minutes=5),
            error="HTTP 503",
            possible_duplicate=True,
            uncertain=True,
        ),
    )
    again = message(store, outbox_id)
    assert (again.state, again.attempt, again.possible_duplicates, again.uncertain) == (
        "pending",
        1,
        1,
        True,
    )
    assert (again.next_attempt_at, again.last_error, again.first_leased_at) == (
        T0 + timedelta(minutes=5),
        "HTTP 503",
        T0,
    )
    assert [(a.attempt, a.outcome, a.error) for a in store.delivery_attempt_list(outbox_id)] == [
        (1, "resent", "HTTP 503")
    ]


def test_a_row_given_back_unsent_records_no_attempt_and_restarts_its_window(store: Store):
    """A lease given back for a rate-limit wait sent nothing: no attempt is spent or recorded,
    and the idempotency window (from `first_leased_at`) has not started."""
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    finish_outbox(
        store,
        outbox_id,
        OutboxFinish(outbox_id, "pending", None, counts_attempt=False, delay=timedelta(seconds=9)),
    )
    back = message(store, outbox_id)
    assert (back.state, back.attempt, back.first_leased_at) == ("pending", 0, None)
    assert back.next_attempt_at == T0 + timedelta(seconds=9)
    assert store.delivery_attempt_list(outbox_id) == []


def expired_rows(store: Store) -> list[int]:
    """Two rows leased (one marked sending) and a third leased later, then the clock past the
    first two leases only; returns the three ids."""
    ids = write_outbox(store, outbox_insert("k/1"), outbox_insert("k/2"), outbox_insert("k/3"))
    first = lease_outbox(store, limit=2)
    store.outbox_mark_sending(ids[1], first[1].lease_token)
    advance(store, timedelta(seconds=20))
    lease_outbox(store, limit=1)  # k/3, its lease ends 20 s after the others
    advance(store, timedelta(seconds=11))
    return ids


def test_outbox_rescue_expired_lets_decide_settle_rows_whose_lease_ran_out(store: Store):
    ids = expired_rows(store)
    shown: list[OutboxRow] = []
    seen_now: list[datetime] = []

    def decide(rows: list[OutboxRow], now: datetime) -> list[OutboxFinish]:
        shown.extend(rows)
        seen_now.append(now)
        return [
            OutboxFinish(ids[0], "pending", "lease_expired", counts_attempt=False),
            OutboxFinish(ids[1], "ambiguous", "ambiguous", counts_attempt=True, uncertain=True),
            OutboxFinish(ids[2], "dead", "dead", counts_attempt=True),  # not offered: ignored
        ]

    applied = store.outbox_rescue_expired(["email"], 10, decide)
    assert [(r.id, r.state) for r in shown] == [(ids[0], "leased"), (ids[1], "sending")]
    assert all(r.lease_token for r in shown)
    assert seen_now == [T0 + timedelta(seconds=31)]
    assert [f.id for f in applied] == ids[:2]
    assert [message(store, i).state for i in ids] == ["pending", "ambiguous", "leased"]
    assert [a.outcome for a in store.delivery_attempt_list(ids[1])] == ["ambiguous"]
    assert message(store, ids[1]).uncertain is True


def test_outbox_rescue_expired_looks_only_at_the_channels_and_limit_asked(store: Store):
    ids = expired_rows(store)
    offered: list[int] = []

    def decide(rows: list[OutboxRow], now: datetime) -> list[OutboxFinish]:
        offered.extend(r.id for r in rows)
        return []

    assert store.outbox_rescue_expired(["sms"], 10, decide) == []
    assert store.outbox_rescue_expired(["email"], 1, decide) == []
    assert offered == [ids[0]]
    assert [message(store, i).state for i in ids] == ["leased", "sending", "leased"]


def test_outbox_ambiguous_list_lists_ambiguous_rows_of_the_channels_by_id(store: Store):
    first = ambiguous(store, "k/1")
    second = ambiguous(store, "k/2")
    write_outbox(store, outbox_insert("k/pending"))
    assert [r.id for r in store.outbox_ambiguous_list(["email"], 10)] == [first, second]
    assert [r.id for r in store.outbox_ambiguous_list(["email"], 1)] == [first]
    assert store.outbox_ambiguous_list(["sms"], 10) == []


def test_outbox_resolve_sent_records_the_receipt_and_audits_it(store: Store):
    outbox_id = ambiguous(store)
    advance(store, timedelta(hours=2))
    action = OperatorAction(outbox_id, "ops-alice", "provider log shows it")
    result = store.outbox_resolve(action, "sent", "msg-42")
    assert result is not None and (result.job_id, result.key) == (outbox_id, "k/1")
    resolved = message(store, outbox_id)
    assert (resolved.state, resolved.receipt, resolved.sent_at) == (
        "sent",
        "msg-42",
        T0 + timedelta(hours=2),
    )
    [audit] = store.audit_list(outbox_id)
    assert audit.id == result.audit_id
    assert (audit.action, audit.target_kind, audit.target_key) == (
        "resolve-sent",
        "delivery",
        "k/1",
    )
    assert store.outbox_resolve(action, "sent", "msg-43") is None  # no longer ambiguous
    assert message(store, outbox_id).receipt == "msg-42"


def test_outbox_resolve_resend_makes_the_row_a_first_send_again(store: Store):
    outbox_id = ambiguous(store)
    advance(store, timedelta(hours=2))
    result = store.outbox_resolve(OperatorAction(outbox_id, "ops", "not received"), "resend", None)
    assert result is not None
    again = message(store, outbox_id)
    assert (again.state, again.next_attempt_at, again.uncertain, again.first_leased_at) == (
        "pending",
        T0 + timedelta(hours=2),
        False,
        None,
    )
    assert [a.action for a in store.audit_list(outbox_id)] == ["resolve-resend"]
    assert [m.id for m in lease_outbox(store)] == [outbox_id]


def test_outbox_replay_makes_a_dead_row_pending_with_a_fresh_budget_and_audits_it(
    store: Store,
):
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "dead", "dead", True, error="422"))
    assert store.outbox_replay(OperatorAction(outbox_id + 1000, "ops", "r")) is None
    advance(store, timedelta(minutes=10))
    result = store.outbox_replay(OperatorAction(outbox_id, "ops-bob", "address fixed"))
    assert result is not None and (result.job_id, result.key) == (outbox_id, "k/1")
    again = message(store, outbox_id)
    assert (again.state, again.attempt, again.attempt_base, again.next_attempt_at) == (
        "pending",
        1,
        1,
        T0 + timedelta(minutes=10),
    )
    [audit] = store.audit_list(outbox_id)
    assert (audit.action, audit.actor, audit.reason) == ("replay", "ops-bob", "address fixed")
    assert json.loads(audit.details or "{}") == {"channel": "email", "attempts_before": 1}
    assert store.outbox_replay(OperatorAction(outbox_id, "ops", "again")) is None


def dead_messages(store: Store, job_id: int, *keys: str) -> list[int]:
    """Messages of the intent `keys[0]` written by job `job_id`, each dead on its first send."""
    ids = write_outbox(store, *(outbox_insert(k, intent_key=keys[0], job_id=job_id) for k in keys))
    for outbox_id in ids:
        finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "dead", "dead", True, error="x"))
    return ids


def test_outbox_discard_renames_the_row_frees_the_intent_and_makes_its_job_dead_again(
    store: Store,
):
    job_id = done_job(store, "digest/c-1")
    [outbox_id] = dead_messages(store, job_id, "digest/c-1")
    assert store.outbox_discard(OperatorAction(outbox_id + 1000, "ops", "r"), "x") is None
    advance(store, timedelta(minutes=5))
    done = store.outbox_discard(
        OperatorAction(outbox_id, "ops-ann", "U+2028 in subject"), "digest/c-1"
    )
    assert done is not None
    renamed = f"digest/c-1~discarded-{outbox_id}"
    assert (done.id, done.key, done.renamed, done.intent_key) == (
        outbox_id,
        "digest/c-1",
        renamed,
        "digest/c-1",
    )
    assert (done.kept, done.intent_released, done.job_reopened) == ((), True, job_id)
    gone = message(store, outbox_id)
    assert (gone.key, gone.state) == (renamed, "discarded")
    assert store.intent_get("digest/c-1") is None
    job = row(store, job_id)
    assert (job.state, job.outcome) == ("dead", None)
    assert job.last_error == f"its message {outbox_id} was discarded by ops-ann: U+2028 in subject"
    [audit] = store.audit_list(outbox_id)
    assert (audit.action, audit.actor, audit.target_key) == ("discard", "ops-ann", "digest/c-1")
    assert json.loads(audit.details or "{}") == {
        "channel": "email",
        "renamed": renamed,
        "intent_released": True,
        "job_reopened": job_id,
    }
    # found by the key it had, counted apart from dead, never replayed or discarded again
    assert [m.id for m in store.outbox_find_by_key("digest/c-1")] == [outbox_id]
    assert store.outbox_count_by_state().counts == {"discarded": 1}
    assert store.outbox_list(OutboxFilter(state="dead")) == []
    assert [m.id for m in store.outbox_list(OutboxFilter(state="discarded"))] == [outbox_id]
    assert store.outbox_replay(OperatorAction(outbox_id, "ops", "again")) is None
    assert store.outbox_discard(OperatorAction(outbox_id, "ops", "again"), "digest/c-1") is None
    # the key is free: the re-run's message takes it
    [again] = write_outbox(store, outbox_insert("digest/c-1", job_id=job_id))
    assert again != outbox_id and message(store, again).state == "pending"


def test_outbox_discard_keeps_the_intent_while_another_message_of_it_stands(store: Store):
    job_id = done_job(store, "digest/c-2")
    first, second = dead_messages(store, job_id, "digest/c-2", "digest/c-2~ops")
    done = store.outbox_discard(OperatorAction(second, "ops", "bad header"), "digest/c-2~ops")
    assert done is not None
    assert (done.kept, done.intent_released, done.job_reopened) == (
        (("digest/c-2", "dead"),),
        False,
        None,
    )
    assert store.intent_get("digest/c-2") is not None and row(store, job_id).state == "done"
    assert [m.id for m in store.outbox_find_by_key("digest/c-2~ops")] == [second]
    last = store.outbox_discard(OperatorAction(first, "ops", "bad subject"), "digest/c-2")
    assert last is not None and (last.kept, last.intent_released, last.job_reopened) == (
        (),
        True,
        job_id,
    )


def test_outbox_discard_refuses_a_row_that_may_have_been_delivered(store: Store):
    [outbox_id] = write_outbox(store, outbox_insert("digest/c-3"))
    finish_outbox(
        store,
        outbox_id,
        OutboxFinish(outbox_id, "dead", "dead", True, error="timeout", uncertain=True),
    )
    assert store.outbox_discard(OperatorAction(outbox_id, "ops", "r"), "digest/c-3") is None
    assert message(store, outbox_id).state == "dead"
    assert store.audit_list(outbox_id) == []


def test_outbox_count_by_state_counts_rows_per_state(store: Store):
    ids = write_outbox(store, outbox_insert("k/1"), outbox_insert("k/2"), outbox_insert("k/3"))
    [first, _second] = lease_outbox(store, limit=2)
    store.outbox_finish(first.lease_token, [sent(ids[0])])
    assert store.outbox_count_by_state().counts == {"sent": 1, "leased": 1, "pending": 1}
    assert store.outbox_count_by_state()["dead"] == 0


def test_outbox_list_is_newest_first_filtered_and_paged_by_id(store: Store):
    ids = write_outbox(
        store, outbox_insert("k/1"), outbox_insert("k/2", channel="sms"), outbox_insert("k/3")
    )
    finish_outbox(store, ids[1], sent(ids[1]))
    assert [r.id for r in store.outbox_list(OutboxFilter())] == ids[::-1]
    assert [r.id for r in store.outbox_list(OutboxFilter(channel="email"))] == [ids[2], ids[0]]
    assert [r.id for r in store.outbox_list(OutboxFilter(state="sent"))] == [ids[1]]
    assert [r.id for r in store.outbox_list(OutboxFilter(before_id=ids[2], limit=1))] == [ids[1]]


def test_delivery_attempt_list_keeps_every_attempt_in_order(store: Store):
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "pending", "failed", True, error="1"))
    finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "pending", "throttled", False))
    finish_outbox(store, outbox_id, sent(outbox_id))
    attempts = store.delivery_attempt_list(outbox_id)
    assert [(a.attempt, a.outcome, a.error, a.receipt) for a in attempts] == [
        (1, "failed", "1", None),
        (1, "throttled", None, None),
        (2, "sent", None, "provider-id-1"),
    ]
    assert store.delivery_attempt_list(outbox_id + 1000) == []
