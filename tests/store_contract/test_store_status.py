"""What `status` reads, on every store: the instants an operator watches — the oldest due
job, the next job and message to fall due, the oldest waiting message, the next lease to run
out — and the store's own time they are measured from; the backlog per task and channel."""

from __future__ import annotations

from datetime import timedelta

from oncebox.outbox.transitions import OutboxFinish
from oncebox.store.params import JobFinish
from oncebox.store.protocol import Store
from oncebox.store.records import BacklogRow, StatusTimes
from support.contract import (
    LEASE,
    T0,
    advance,
    finish_outbox,
    insert,
    lease,
    lease_outbox,
    opened_session,
    outbox_insert,
    settle,
    write_outbox,
)


def test_status_times_of_an_empty_store_is_only_its_time(store: Store):
    times = store.status_times()
    assert times == StatusTimes(None, None, None, None, None, None, T0)
    assert times.next_event() is None


def test_status_times_shows_the_instants_the_queue_and_the_outbox_wait_for(store: Store):
    insert(store, "k/overdue", run_at=T0 - timedelta(hours=1))
    insert(store, "k/later", delay=timedelta(hours=2))
    leased = insert(store, "k/leased", "u")
    with opened_session(store) as session:
        _token, ids = lease(session, tasks=("u",))
        assert ids == [leased]
    write_outbox(store, outbox_insert("k/waiting"))
    advance(store, timedelta(minutes=1))
    write_outbox(store, outbox_insert("k/leased-message", channel="sms"))
    lease_outbox(store, channels=("sms",))
    advance(store, timedelta(minutes=1))
    times = store.status_times()
    assert times == StatusTimes(
        oldest_due_ready=T0 - timedelta(hours=1),
        next_ready=T0 - timedelta(hours=1),
        next_pending_message=T0,
        oldest_pending_message=T0,
        next_job_lease_end=T0 + LEASE,
        next_message_lease_end=T0 + timedelta(minutes=1) + LEASE,
        now=T0 + timedelta(minutes=2),
        jobs_past_lease=1,  # both 30 s leases have run out: the rescuer's to take back
        messages_past_lease=1,
    )
    assert times.next_event() == T0 - timedelta(hours=1)


def test_status_times_counts_the_leases_run_out_and_not_yet_rescued(store: Store):
    insert(store, "k/leased", "u")
    with opened_session(store) as session:
        lease(session, tasks=("u",))
    write_outbox(store, outbox_insert("k/message"))
    lease_outbox(store, channels=("email",))
    times = store.status_times()
    assert (times.jobs_past_lease, times.messages_past_lease) == (0, 0)
    advance(store, LEASE + timedelta(seconds=1))
    times = store.status_times()
    assert (times.jobs_past_lease, times.messages_past_lease) == (1, 1)
    assert store.job_rescue_expired(limit=10)
    assert store.status_times().jobs_past_lease == 0


def test_backlog_list_counts_unfinished_work_per_task_and_channel(store: Store):
    insert(store, "k/due", "digest")
    insert(store, "k/later", "digest", delay=timedelta(minutes=10))
    done = insert(store, "k/done", "report")
    settle(store, done, JobFinish(done, "done", outcome="completed"), task="report")
    leased = insert(store, "k/leased", "expire")
    with opened_session(store) as session:
        _token, ids = lease(session, tasks=("expire",))
        assert ids == [leased]
    sent, _waiting, _held = write_outbox(
        store, outbox_insert("k/1"), outbox_insert("k/2"), outbox_insert("k/3", channel="sms")
    )
    finish_outbox(store, sent, OutboxFinish(sent, "sent", "sent", True, receipt="r"))
    lease_outbox(store, channels=("sms",))
    assert store.backlog_list() == [
        BacklogRow("job", "digest", 2, T0, 0, None),
        BacklogRow("job", "expire", 0, None, 1, T0 + LEASE),
        BacklogRow("message", "email", 1, T0, 0, None),
        BacklogRow("message", "sms", 0, None, 1, T0 + LEASE),
    ]
    assert store.backlog_list()[1].next_at() == T0 + LEASE
