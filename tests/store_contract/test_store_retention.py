"""Retention on every store: each kind of row is pruned (or thinned) in batches, oldest first,
once past its retention — and never while something may still act on it or read through it:
an unfinished job, a message not sent, a dead letter's story, a period's summary whose jobs
remain. Each batch is counted; `prunable` says, with the same conditions, what a batch would
take and how old the oldest kept row is."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.outbox.transitions import OutboxFinish
from oncebox.store.params import (
    JobFinish,
    JobInsertMany,
    OperatorAction,
    OutboxFilter,
    ScheduleRunRef,
)
from oncebox.store.protocol import Store
from oncebox.store.records import HistoryTended, ScheduleRunClaim
from support.contract import (
    T0,
    advance,
    ambiguous,
    dead_job,
    done_job,
    finish_outbox,
    insert,
    lease,
    message,
    opened_session,
    outbox_insert,
    settle,
    write_outbox,
)

WEEK = timedelta(days=7)


def sent(store: Store, key: str, *, channel: str = "email", job_id: int | None = None) -> int:
    """A message written (by job `job_id`, if given), failed once, then sent: two attempts."""
    [outbox_id] = write_outbox(store, outbox_insert(key, channel=channel, job_id=job_id))
    finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "pending", "failed", True, error="x"))
    finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "sent", "sent", True, receipt="r"))
    return outbox_id


def dead_message(store: Store, key: str) -> int:
    [outbox_id] = write_outbox(store, outbox_insert(key))
    finish_outbox(store, outbox_id, OutboxFinish(outbox_id, "dead", "dead", True, error="550"))
    return outbox_id


def counters(store: Store) -> dict[str, int]:
    return {k: v for k, v in store.counter_list().items() if k.startswith(("pruned", "payloads"))}


def test_prune_of_jobs_takes_one_tasks_finished_jobs_oldest_first_and_counts_them(store: Store):
    first = done_job(store, "k/first", task="t")
    advance(store, timedelta(minutes=1))
    second = done_job(store, "k/second", task="t")
    other = done_job(store, "k/other", task="u")
    dead = dead_job(store, "k/dead", task="t")
    advance(store, WEEK + timedelta(days=1))
    assert store.prune_names("jobs") == ["t", "u"]
    assert store.prunable("jobs", "t", WEEK, limit=100).waiting == 2
    assert store.prune("jobs", "t", WEEK, limit=1) == 1
    assert store.job_get(first) is None and store.job_get(second) is not None
    assert store.prune("jobs", "t", WEEK, limit=10) == 1
    assert store.prune("jobs", "t", WEEK, limit=10) == 0
    assert store.job_get(other) is not None and store.job_get(dead) is not None
    assert counters(store) == {"pruned_jobs": 2}


def test_prune_of_payloads_drops_a_sent_messages_content_and_keeps_its_row(store: Store):
    old = sent(store, "m/old")
    held = ambiguous(store, "m/held")
    dead = dead_message(store, "m/dead")
    other_channel = sent(store, "m/sms", channel="sms")
    advance(store, WEEK)
    young = sent(store, "m/young")
    [pending] = write_outbox(store, outbox_insert("m/pending"))
    advance(store, timedelta(seconds=1))
    assert store.prunable("payloads", "email", WEEK, limit=100).waiting == 1
    assert store.prune("payloads", "email", WEEK, limit=100) == 1
    assert store.prune("payloads", "email", WEEK, limit=100) == 0

    thinned = message(store, old)
    assert json.loads(thinned.payload_json) == {}
    assert thinned.payload_dropped_at == T0 + WEEK + timedelta(seconds=1)
    assert (thinned.state, thinned.receipt, thinned.key) == ("sent", "r", "m/old")
    assert len(store.delivery_attempt_list(old)) == 2  # attempts have a retention of their own
    for kept in (held, dead, pending, other_channel, young):
        assert json.loads(message(store, kept).payload_json) == {"to": ["a@b.example"]}
        assert message(store, kept).payload_dropped_at is None
    assert counters(store) == {"payloads_dropped": 1}


def test_prune_of_messages_waits_for_the_job_that_wrote_each(store: Store):
    """A sent row is deleted, with its attempts, only once its job is gone — the job's period
    figures read its messages until job_prune has added them to the run's summary."""
    job = done_job(store, "k/job")
    of_job = sent(store, "m/of-job", job_id=job)
    on_its_own = sent(store, "m/own")
    held = ambiguous(store, "m/held")
    dead = dead_message(store, "m/dead")
    advance(store, timedelta(days=91))
    holding = store.prunable("messages", "email", timedelta(days=90), limit=100)
    assert (holding.oldest, holding.waiting) == (T0, 1)
    assert store.prune("messages", "email", timedelta(days=90), limit=100) == 1
    assert store.outbox_get(on_its_own) is None
    assert store.delivery_attempt_list(on_its_own) == []
    assert store.outbox_get(of_job) is not None

    assert store.prune("jobs", "t", WEEK, limit=100) == 1
    assert store.prune("messages", "email", timedelta(days=90), limit=100) == 1
    assert store.outbox_get(of_job) is None
    assert store.outbox_get(held) is not None and store.outbox_get(dead) is not None
    assert store.prunable("messages", "email", timedelta(days=90), limit=100).oldest is None
    assert counters(store) == {"pruned_jobs": 1, "pruned_messages": 2}
    assert store.outbox_count_by_state()["sent"] == 0  # the depths follow the deletes


def test_prune_of_messages_waits_while_another_message_of_the_intent_waits(store: Store):
    """Messages with no job (a sweeper's, a transport's) are held by their siblings: were the
    sent one deleted, discarding the dead one would free the intent, and a redelivery of the
    key would send the first message again."""
    [first, second] = write_outbox(
        store,
        outbox_insert("notice/1", intent_key="notice/1"),
        outbox_insert("notice/1~2", intent_key="notice/1"),
    )
    finish_outbox(store, first, OutboxFinish(first, "sent", "sent", True, receipt="r"))
    finish_outbox(store, second, OutboxFinish(second, "dead", "dead", True, error="550"))
    advance(store, timedelta(days=91))
    assert store.prunable("messages", "email", timedelta(days=90), limit=10).waiting == 0
    assert store.prune("messages", "email", timedelta(days=90), limit=10) == 0
    discarded = store.outbox_discard(OperatorAction(second, "ops", "gone"), "notice/1~2")
    assert discarded is not None and not discarded.intent_released  # the sent one stands
    assert store.prune("messages", "email", timedelta(days=90), limit=10) == 1


def test_prune_of_delivery_attempts_keeps_every_attempt_of_a_message_not_sent(store: Store):
    delivered = sent(store, "m/sent")
    dead = dead_message(store, "m/dead")
    [retrying] = write_outbox(store, outbox_insert("m/retrying"))
    finish_outbox(store, retrying, OutboxFinish(retrying, "pending", "failed", True, error="4xx"))
    advance(store, timedelta(days=31))
    assert store.prunable("delivery_attempts", "", timedelta(days=30), limit=100).waiting == 2
    assert store.prune("delivery_attempts", "", timedelta(days=30), limit=1) == 1
    assert store.prune("delivery_attempts", "", timedelta(days=30), limit=100) == 1
    assert store.delivery_attempt_list(delivered) == []
    assert message(store, delivered).receipt == "r"  # the row keeps its receipt
    # and a listing by age still finds it, by when it was sent
    old_sent = store.outbox_list(OutboxFilter(state="sent", older_than=timedelta(days=30)))
    assert [m.id for m in old_sent] == [delivered]
    assert len(store.delivery_attempt_list(dead)) == 1
    assert len(store.delivery_attempt_list(retrying)) == 1
    assert counters(store) == {"pruned_delivery_attempts": 2}


def test_prune_of_the_audit_keeps_a_dead_letters_story(store: Store):
    cancelled = insert(store, "k/cancelled")
    store.job_cancel(OperatorAction(cancelled, "ops", "not needed"))
    died_again = dead_job(store, "k/died-again")
    store.job_replay(OperatorAction(died_again, "ops", "fixed, I hope"))
    settle(store, died_again, JobFinish(died_again, "dead", error="not fixed"))
    delivered = sent(store, "m/sent")
    store.outbox_report_duplicate(OperatorAction(delivered, "ops", "customer saw two"))
    dead = dead_message(store, "m/dead")
    assert store.outbox_discard(OperatorAction(dead, "ops", "address gone"), "m/dead")
    advance(store, timedelta(days=731))
    assert store.prune_names("audit") == [""]
    assert store.prunable("audit", "", timedelta(days=730), limit=100).waiting == 2
    assert store.prune("audit", "", timedelta(days=730), limit=100) == 2
    assert sorted(a.action for a in store.audit_list()) == ["discard", "replay"]
    assert counters(store) == {"pruned_audit_entries": 2}


def fan_out_done(store: Store, period: str) -> list[int]:
    """A finished run of `period` whose one job is done."""
    claim = ScheduleRunClaim("weekly", period, T0, "s1", timedelta(minutes=5))
    assert store.schedule_run_claim(claim)
    created = store.job_insert_many(
        JobInsertMany(
            task="digest",
            queue="default",
            priority=0,
            max_attempts=1,
            rows=[(f"digest/1/{period}", json.dumps({"customer": 1}), None, None)],
            for_run=ScheduleRunRef("weekly", period, "s1", timedelta(minutes=5)),
        )
    )
    store.schedule_run_finish("weekly", period, "s1", eligible=1, enqueued=0)
    ids = [job_id for job_id, _key in created.created]
    with opened_session(store) as session:
        token, leased = lease(session, tasks=("digest",))
        assert leased == ids
        with session.transaction() as tx:
            tx.job_finish(token, [JobFinish(ids[0], "done", outcome="completed")])
    return ids


def test_prune_of_schedule_runs_waits_for_their_periods_jobs(store: Store):
    """A run is its period's summary: deleted only once no job of the period reads through it
    (and, by the policy, never within the schedule's catch-up window)."""
    fan_out_done(store, "2026-W34")
    advance(store, timedelta(days=400))
    assert store.prune_names("schedule_runs") == ["weekly"]
    assert store.prune("schedule_runs", "weekly", timedelta(days=365), limit=10) == 0
    assert store.prune("jobs", "digest", WEEK, limit=10) == 1
    [run] = store.schedule_run_list("weekly")
    assert run.period == "2026-W34"  # its summary now holds the pruned job's figures
    assert store.prunable("schedule_runs", "weekly", timedelta(days=365), limit=10).waiting == 1
    assert store.prune("schedule_runs", "weekly", timedelta(days=365), limit=10) == 1
    assert store.schedule_run_list("weekly") == []
    assert counters(store) == {"pruned_jobs": 1, "pruned_schedule_runs": 1}


def test_prunable_counts_up_to_its_limit_and_nothing_for_ever_kept_rows(store: Store):
    for n in range(3):
        sent(store, f"m/{n}")
    advance(store, timedelta(days=1))
    assert store.prunable("payloads", "email", timedelta(0), limit=2).waiting == 2
    forever = store.prunable("payloads", "email", None, limit=100)
    assert (forever.oldest, forever.waiting) == (T0, 0)
    assert store.prune_names("payloads") == ["email"]
    assert store.prunable("payloads", "nothing-here", timedelta(0), limit=10).oldest is None


def test_a_history_by_week_is_made_ahead_and_a_week_past_retention_goes_whole(store: Store):
    """PostgreSQL's history of finished jobs (0025); SQLite keeps them in its jobs table, where
    both operations have nothing to do."""
    tended = store.job_history_tend(WEEK, 100)
    if not store.keeps_history:
        assert tended == HistoryTended(0, 0, 0)
        done_job(store, "k/done")
        advance(store, 4 * WEEK)
        assert store.job_history_drop({}, WEEK) == 0
        return
    assert tended.made and (tended.moved, tended.waiting) == (0, 0)  # T0's week and the next
    done = done_job(store, "k/done")
    kept = done_job(store, "k/kept", task="u")
    advance(store, 4 * WEEK)
    assert store.job_history_drop({"u": None}, WEEK) == 0  # a task kept for ever holds its week
    assert store.job_get(done) is not None
    assert store.job_history_drop({"u": WEEK}, WEEK) == 2
    assert store.job_get(done) is None and store.job_get(kept) is None
    assert counters(store) == {"pruned_jobs": 2}
    assert "done" not in store.job_count_by_state().counts
