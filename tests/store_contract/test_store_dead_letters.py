"""Dead letters in the store, on every store: a dead job discarded (cancelled in place, audited,
its key free), replays and discards fenced on the attempt count an operator confirmed, and the
listings' dead-letter filters — error text, schedule period, how long ago a row died — applied
by the statements themselves."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.outbox.transitions import OutboxFinish
from oncebox.store.params import (
    JobFilter,
    JobFinish,
    JobInsertMany,
    OperatorAction,
    OutboxFilter,
    ScheduleRunRef,
)
from oncebox.store.protocol import Store
from oncebox.store.records import ScheduleRunClaim
from support.contract import (
    LEASE,
    T0,
    advance,
    dead_job,
    finish_outbox,
    insert,
    job,
    lease,
    message,
    opened_session,
    outbox_insert,
    row,
    settle,
    write_outbox,
)


def test_job_discard_cancels_a_dead_job_in_place_keeping_its_attempts_and_audits_it(
    store: Store,
):
    job_id = dead_job(store, "k/1")
    advance(store, timedelta(hours=3))
    result = store.job_discard(OperatorAction(job_id, "ops-ann", "customer left; abandon it"))
    assert result is not None and (result.job_id, result.key) == (job_id, "k/1")
    discarded = row(store, job_id)
    assert (discarded.state, discarded.outcome, discarded.attempt, discarded.last_error) == (
        "cancelled",
        None,
        1,
        "boom",
    )
    assert discarded.finished_at == T0 + timedelta(hours=3)
    assert [(a.attempt, a.outcome, a.error) for a in store.job_attempt_list(job_id)] == [
        (1, "dead", "boom")
    ]
    [audit] = store.audit_list(job_id)
    assert audit.id == result.audit_id
    assert (audit.action, audit.actor, audit.reason, audit.target_kind, audit.target_key) == (
        "discard",
        "ops-ann",
        "customer left; abandon it",
        "job",
        "k/1",
    )
    assert json.loads(audit.details or "{}") == {"task": "t", "attempts": 1}
    # a second discard finds no dead job and writes nothing
    assert store.job_discard(OperatorAction(job_id, "ops", "again")) is None
    assert len(store.audit_list(job_id)) == 1
    # the key is free: the same operation can be enqueued afresh
    again, created = store.job_insert(job("k/1"))
    assert created and again != job_id


def test_job_discard_leaves_a_job_that_is_not_dead(store: Store):
    ready = insert(store, "k/ready")
    assert store.job_discard(OperatorAction(ready, "ops", "r")) is None
    assert row(store, ready).state == "ready"
    assert store.job_discard(OperatorAction(10**9, "ops", "r")) is None
    assert store.audit_list() == []


def test_a_replay_or_discard_fenced_on_an_attempt_count_acts_only_while_it_still_holds(
    store: Store,
):
    replayed, discarded = dead_job(store, "k/1"), dead_job(store, "k/2")
    for act in (store.job_replay, store.job_discard):
        assert act(OperatorAction(replayed, "ops", "r", if_attempt=2)) is None
    assert row(store, replayed).state == "dead"
    assert store.job_replay(OperatorAction(replayed, "ops", "r", if_attempt=1)) is not None
    assert store.job_discard(OperatorAction(discarded, "ops", "r", if_attempt=1)) is not None
    messages = write_outbox(store, outbox_insert("m/1"), outbox_insert("m/2"))
    for outbox_id in messages:
        finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "dead", "dead", True, error="x"))
    first, second = messages
    assert store.outbox_replay(OperatorAction(first, "ops", "r", if_attempt=0)) is None
    assert store.outbox_discard(OperatorAction(second, "ops", "r", if_attempt=2), "m/2") is None
    assert [message(store, m).state for m in messages] == ["dead", "dead"]
    assert store.outbox_replay(OperatorAction(first, "ops", "r", if_attempt=1)) is not None
    assert store.outbox_discard(OperatorAction(second, "ops", "r", if_attempt=1), "m/2")
    assert [message(store, m).state for m in messages] == ["pending", "discarded"]
    assert sorted(a.action for a in store.audit_list()) == ["discard"] * 2 + ["replay"] * 2


def fanned_out(store: Store, period: str, keys: list[str]) -> list[int]:
    """Jobs of task `digest` enqueued by the weekly fan-out of `period`."""
    store.schedule_run_claim(ScheduleRunClaim("weekly", period, None, "s1", LEASE))
    result = store.job_insert_many(
        JobInsertMany(
            task="digest",
            queue="default",
            priority=0,
            max_attempts=1,
            rows=[(key, "{}", None, None) for key in keys],
            for_run=ScheduleRunRef("weekly", period, "s1", LEASE),
        )
    )
    return [job_id for job_id, _key in result.created]


def die(store: Store, errors: dict[int, str]) -> None:
    """Lease the due jobs of task `digest` (exactly those of `errors`) and kill each with its
    error."""
    with opened_session(store) as session:
        token, ids = lease(session, tasks=("digest",))
        assert sorted(ids) == sorted(errors)
        with session.transaction() as tx:
            tx.job_finish(token, [JobFinish(i, "dead", error=e) for i, e in errors.items()])


def dead_ids(store: Store, **where: object) -> list[int]:
    return [j.id for j in store.job_list(JobFilter(state="dead", **where))]  # type: ignore[arg-type]


def test_job_list_narrows_dead_jobs_by_error_period_and_age_and_combines_them(store: Store):
    old_smtp, old_bug = fanned_out(store, "2026-W33", ["d/1/W33", "d/2/W33"])
    die(store, {old_smtp: "SMTP 550: No Such User", old_bug: "KeyError: 'email'"})
    advance(store, timedelta(hours=5))
    [new_smtp] = fanned_out(store, "2026-W34", ["d/1/W34"])
    die(store, {new_smtp: "smtp 550: no such user\nTraceback …"})
    done = insert(store, "k/done", "digest")
    settle(store, done, JobFinish(done, "done", outcome="completed"), task="digest")
    advance(store, timedelta(hours=1))  # now T0 + 6h: the W33 jobs died 6 h ago, W34's 1 h ago

    assert dead_ids(store) == [new_smtp, old_bug, old_smtp]
    assert dead_ids(store, error="such USER") == [new_smtp, old_smtp]  # any case
    assert dead_ids(store, error="such user\ntrace") == [new_smtp]  # across lines
    assert dead_ids(store, error="50%") == []  # no wildcards: the text as given
    assert dead_ids(store, period="2026-W33") == [old_bug, old_smtp]
    assert dead_ids(store, older_than=timedelta(hours=2)) == [old_bug, old_smtp]
    assert dead_ids(store, older_than=timedelta(hours=6)) == [old_bug, old_smtp]  # inclusive
    assert dead_ids(store, newer_than=timedelta(hours=2)) == [new_smtp]
    assert dead_ids(store, newer_than=timedelta(hours=6)) == [new_smtp]
    assert dead_ids(store, error="550", period="2026-W33") == [old_smtp]
    assert dead_ids(store, error="550", newer_than=timedelta(hours=2)) == [new_smtp]
    assert dead_ids(store, period="2026-W34", older_than=timedelta(hours=2)) == []
    # paged by id as before, filters kept
    assert dead_ids(store, error="550", before_id=new_smtp) == [old_smtp]
    # not finished: no age; finished and not dead: not listed as dead
    assert [j.id for j in store.job_list(JobFilter(newer_than=timedelta(days=1)))] == [
        done,
        new_smtp,
        old_bug,
        old_smtp,
    ]


def test_outbox_list_narrows_by_error_the_writing_jobs_period_and_the_last_attempts_age(
    store: Store,
):
    [w33], [w34] = fanned_out(store, "2026-W33", ["d/1"]), fanned_out(store, "2026-W34", ["d/2"])
    old, new, never_sent, from_nowhere = write_outbox(
        store,
        outbox_insert("m/old", job_id=w33),
        outbox_insert("m/new", job_id=w34),
        outbox_insert("m/waiting", job_id=w33, channel="sms"),
        outbox_insert("m/broker", job_id=None, channel="webhook"),
    )
    finish_outbox(store, old, OutboxFinish(old, "pending", "failed", True, error="503"))
    advance(store, timedelta(hours=1))
    finish_outbox(store, old, OutboxFinish(old, "dead", "dead", True, error="550 No Such User"))
    finish_outbox(
        store, from_nowhere, OutboxFinish(from_nowhere, "dead", "dead", True, error="422 body")
    )
    advance(store, timedelta(hours=4))
    finish_outbox(store, new, OutboxFinish(new, "dead", "dead", True, error="550 no such USER"))
    advance(store, timedelta(minutes=30))  # old and from_nowhere died 4.5 h ago, new 30 min ago

    def ids(**where: object) -> list[int]:
        return [m.id for m in store.outbox_list(OutboxFilter(state="dead", **where))]  # type: ignore[arg-type]

    assert ids() == [from_nowhere, new, old]
    assert ids(error="no such user") == [new, old]
    assert ids(period="2026-W33") == [old]  # its job's period; a row of no job has none
    assert ids(older_than=timedelta(hours=1)) == [from_nowhere, old]
    assert ids(newer_than=timedelta(hours=1)) == [new]
    assert ids(error="550", older_than=timedelta(hours=1)) == [old]
    assert ids(period="2026-W34", error="422") == []
    listed = {m.id: m.last_attempt_at for m in store.outbox_list(OutboxFilter())}
    assert listed == {
        old: T0 + timedelta(hours=1),  # the attempt it died of, not its first
        new: T0 + timedelta(hours=5),
        never_sent: None,
        from_nowhere: T0 + timedelta(hours=1),
    }
    assert message(store, old).last_attempt_at is None  # read by the listing only
    assert [m.id for m in store.outbox_list(OutboxFilter(newer_than=timedelta(days=1)))] == [
        from_nowhere,
        new,
        old,
    ]  # a row never attempted has no age
