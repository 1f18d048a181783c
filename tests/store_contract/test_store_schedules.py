"""Schedules, operation by operation, on every store: a schedule's state (its last fire, paused
or not), the runs that fan a period out under a lease one scheduler holds, the jobs a run
enqueues with its count in the same transaction, and a period's coverage."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

from oncebox.outbox.transitions import OutboxFinish
from oncebox.store.params import Audit, AuditFilter, JobFinish, JobInsertMany, ScheduleRunRef
from oncebox.store.protocol import Store
from oncebox.store.records import ScheduleRunClaim, ScheduleRunTakeOver, ScheduleState
from support.contract import (
    T0,
    advance,
    finish_outbox,
    lease,
    opened_session,
    outbox_insert,
    row,
)

WEEKLY = "weekly-digest"
LEASE = timedelta(minutes=5)


def claim(
    owner: str = "s1", period: str = "2026-W34", *, rescan: bool = False, late: bool = False
) -> ScheduleRunClaim:
    return ScheduleRunClaim(
        schedule=WEEKLY,
        period=period,
        fire_at=T0 - timedelta(seconds=30),
        owner=owner,
        lease_for=LEASE,
        late=late,
        rescan=rescan,
    )


def test_schedule_state_is_created_on_first_sight_as_if_it_fired_a_grace_ago(store: Store):
    first = store.schedule_state(WEEKLY, grace=timedelta(hours=1))
    assert first == ScheduleState(paused=False, last_fire_at=T0 - timedelta(hours=1), now=T0)
    advance(store, timedelta(minutes=1))
    again = store.schedule_state(WEEKLY, grace=timedelta(days=7))  # a later grace changes nothing
    assert (again.last_fire_at, again.now) == (T0 - timedelta(hours=1), T0 + timedelta(minutes=1))
    assert store.schedule_state_list() == [(WEEKLY, False, T0 - timedelta(hours=1))]


def test_schedule_state_advance_moves_the_last_fire_forward_never_back(store: Store):
    store.schedule_state(WEEKLY, grace=timedelta(0))
    store.schedule_state_advance(WEEKLY, T0 + timedelta(days=7))
    assert store.schedule_state(WEEKLY, timedelta(0)).last_fire_at == T0 + timedelta(days=7)
    store.schedule_state_advance(WEEKLY, T0 + timedelta(days=1))
    assert store.schedule_state(WEEKLY, timedelta(0)).last_fire_at == T0 + timedelta(days=7)


def test_schedule_state_pause_is_audited_and_resuming_skips_the_fires_that_passed(store: Store):
    store.schedule_state(WEEKLY, grace=timedelta(0))
    store.schedule_state_pause(WEEKLY, True, Audit("ops-alice", "customer migration"))
    assert store.schedule_state(WEEKLY, timedelta(0)).paused is True
    advance(store, timedelta(days=15))
    store.schedule_state_pause(WEEKLY, False, Audit("ops-alice", "done"))
    resumed = store.schedule_state(WEEKLY, timedelta(0))
    assert (resumed.paused, resumed.last_fire_at) == (False, T0 + timedelta(days=15))
    audits = store.audit_search(AuditFilter(key=WEEKLY))
    assert [(a.action, a.target_kind, a.target_id, a.actor, a.reason) for a in audits] == [
        ("resume", "schedule", None, "ops-alice", "done"),
        ("pause", "schedule", None, "ops-alice", "customer migration"),
    ]


def test_pausing_an_unseen_schedule_creates_it_paused_and_without_audit_writes_none(
    store: Store,
):
    store.schedule_state_pause("nightly", True)
    assert store.schedule_state_list() == [("nightly", True, T0)]
    assert store.audit_search(AuditFilter()) == []


def test_schedule_state_list_lists_every_schedule_by_name(store: Store):
    store.schedule_state("b", grace=timedelta(0))
    store.schedule_state("a", grace=timedelta(minutes=1))
    store.schedule_state_pause("b", True)
    assert store.schedule_state_list() == [
        ("a", False, T0 - timedelta(minutes=1)),
        ("b", True, T0),
    ]


def test_schedule_run_claim_gives_a_period_to_one_scheduler_until_its_lease_runs_out(
    store: Store,
):
    assert store.schedule_run_claim(claim("s1", late=True)) is True
    [run] = store.schedule_run_list(WEEKLY)
    assert (run.schedule, run.period, run.state, run.owner, run.late) == (
        WEEKLY,
        "2026-W34",
        "running",
        "s1",
        True,
    )
    assert (run.fire_at, run.started_at, run.lease_expires_at, run.finished_at) == (
        T0 - timedelta(seconds=30),
        T0,
        T0 + LEASE,
        None,
    )
    assert (run.scans, run.eligible_count, run.enqueued_count) == (0, None, 0)
    assert store.schedule_run_claim(claim("s2")) is False
    advance(store, LEASE + timedelta(seconds=1))
    assert store.schedule_run_claim(claim("s2")) is True  # the first owner's lease ran out
    [taken] = store.schedule_run_list(WEEKLY)
    assert (taken.owner, taken.started_at) == ("s2", T0 + LEASE + timedelta(seconds=1))


def test_a_finished_run_is_claimed_again_only_for_a_rescan(store: Store):
    store.schedule_run_claim(claim("s1"))
    assert store.schedule_run_finish(WEEKLY, "2026-W34", "s1", eligible=3, enqueued=3)
    assert store.schedule_run_claim(claim("s2")) is False
    assert store.schedule_run_claim(claim("s2", rescan=True)) is True
    [run] = store.schedule_run_list(WEEKLY)
    assert (run.state, run.owner, run.finished_at, run.scans) == ("running", "s2", None, 1)


def test_schedule_run_extend_pushes_the_owners_lease_and_adds_to_its_count(store: Store):
    store.schedule_run_claim(claim("s1"))
    advance(store, timedelta(minutes=4))
    assert store.schedule_run_extend(WEEKLY, "2026-W34", "s1", LEASE, enqueued=500) is True
    assert store.schedule_run_extend(WEEKLY, "2026-W34", "s2", LEASE, enqueued=7) is False
    assert store.schedule_run_extend(WEEKLY, "2026-W35", "s1", LEASE, enqueued=7) is False
    [run] = store.schedule_run_list(WEEKLY)
    assert (run.lease_expires_at, run.enqueued_count) == (T0 + timedelta(minutes=9), 500)


def test_schedule_run_finish_records_the_scan_once_by_its_owner(store: Store):
    store.schedule_run_claim(claim("s1"))
    store.schedule_run_extend(WEEKLY, "2026-W34", "s1", LEASE, enqueued=2)
    advance(store, timedelta(minutes=1))
    assert store.schedule_run_finish(WEEKLY, "2026-W34", "s2", eligible=9, enqueued=9) is False
    assert store.schedule_run_finish(WEEKLY, "2026-W34", "s1", eligible=3, enqueued=1) is True
    assert store.schedule_run_finish(WEEKLY, "2026-W34", "s1", eligible=3, enqueued=1) is False
    [run] = store.schedule_run_list(WEEKLY)
    assert (run.state, run.finished_at, run.lease_expires_at) == (
        "done",
        T0 + timedelta(minutes=1),
        None,
    )
    assert (run.scans, run.eligible_count, run.enqueued_count) == (1, 3, 3)


def test_schedule_run_busy_names_another_period_whose_fan_out_is_live(store: Store):
    store.schedule_run_claim(claim("s1", "2026-W33"))
    assert store.schedule_run_busy(WEEKLY, "2026-W34") == "2026-W33"
    assert store.schedule_run_busy(WEEKLY, "2026-W33") is None  # its own period
    assert store.schedule_run_busy("other", "2026-W34") is None
    advance(store, LEASE + timedelta(seconds=1))
    assert store.schedule_run_busy(WEEKLY, "2026-W34") is None  # its owner is gone


def test_schedule_run_stalled_lists_running_fan_outs_whose_owner_is_gone_oldest_first(
    store: Store,
):
    store.schedule_run_claim(claim("s1", "2026-W33"))
    advance(store, timedelta(minutes=1))
    store.schedule_run_claim(claim("s1", "2026-W34"))
    store.schedule_run_claim(claim("s1", "2026-W35"))
    store.schedule_run_finish(WEEKLY, "2026-W35", "s1", eligible=0, enqueued=0)
    assert store.schedule_run_stalled(WEEKLY) == []
    advance(store, LEASE + timedelta(seconds=1))
    stalled = store.schedule_run_stalled(WEEKLY)
    assert [(r.period, r.state, r.owner) for r in stalled] == [
        ("2026-W33", "running", "s1"),
        ("2026-W34", "running", "s1"),
    ]
    assert store.schedule_run_stalled("other") == []


def test_schedule_run_renew_records_a_sign_of_life_of_the_owner_only(store: Store):
    store.schedule_run_claim(claim("s1"))
    claimed = store.schedule_run_get(WEEKLY, "2026-W34")
    assert claimed is not None and claimed.renewed_at == T0  # the claim renews
    advance(store, timedelta(seconds=20))
    assert store.schedule_run_renew(WEEKLY, "2026-W34", "s1") is True
    assert store.schedule_run_renew(WEEKLY, "2026-W34", "s2") is False
    advance(store, timedelta(seconds=20))
    store.schedule_run_extend(WEEKLY, "2026-W34", "s1", LEASE, enqueued=1)  # so does a batch
    run = store.schedule_run_get(WEEKLY, "2026-W34")
    assert run is not None
    assert (run.renewed_at, run.lease_expires_at) == (
        T0 + timedelta(seconds=40),
        T0 + timedelta(seconds=40) + LEASE,
    )
    store.schedule_run_finish(WEEKLY, "2026-W34", "s1", eligible=1, enqueued=0)
    assert store.schedule_run_renew(WEEKLY, "2026-W34", "s1") is False  # done: nothing to renew


def test_schedule_run_get_and_running_read_one_run_and_every_running_one(store: Store):
    assert store.schedule_run_get(WEEKLY, "2026-W34") is None
    store.schedule_run_claim(claim("s1", "2026-W33"))
    store.schedule_run_claim(claim("s1", "2026-W34"))
    store.schedule_run_finish(WEEKLY, "2026-W33", "s1", eligible=0, enqueued=0)
    store.schedule_run_claim(dataclasses.replace(claim("s3", "2026-08"), schedule="monthly"))
    got = store.schedule_run_get(WEEKLY, "2026-W33")
    assert got is not None and (got.state, got.owner) == ("done", "s1"), got
    running = store.schedule_run_running()
    assert [(r.schedule, r.period, r.owner, r.renewed_at) for r in running] == [
        ("monthly", "2026-08", "s3", T0),
        (WEEKLY, "2026-W34", "s1", T0),
    ]


def test_schedule_run_take_over_takes_the_run_as_read_audited_or_nothing(store: Store):
    store.schedule_run_claim(claim("s1"))
    advance(store, timedelta(minutes=1))
    seen = store.schedule_run_get(WEEKLY, "2026-W34")
    assert seen is not None and seen.lease_expires_at is not None
    take = ScheduleRunTakeOver(
        WEEKLY,
        "2026-W34",
        "ops",
        LEASE,
        seen_owner="s1",
        seen_lease_expires_at=seen.lease_expires_at,
        seen_renewed_at=seen.renewed_at,
        actor="ops-alice",
        reason="s1 died with the store",
    )
    store.schedule_run_renew(WEEKLY, "2026-W34", "s1")  # after the read: no longer as read
    assert store.schedule_run_take_over(take) is None
    kept = store.schedule_run_get(WEEKLY, "2026-W34")
    assert kept is not None and kept.owner == "s1"
    assert store.audit_search(AuditFilter(action="take-over")) == []
    seen = store.schedule_run_get(WEEKLY, "2026-W34")
    assert seen is not None
    take = dataclasses.replace(take, seen_renewed_at=seen.renewed_at)
    audit_id = store.schedule_run_take_over(take)
    assert audit_id is not None
    taken = store.schedule_run_get(WEEKLY, "2026-W34")
    assert taken is not None
    now = T0 + timedelta(minutes=1)
    assert (taken.state, taken.owner, taken.lease_expires_at, taken.renewed_at) == (
        "running",
        "ops",
        now + LEASE,
        now,
    )
    assert store.schedule_run_extend(WEEKLY, "2026-W34", "s1", LEASE, enqueued=1) is False
    [audit] = store.audit_search(AuditFilter(action="take-over"))
    assert (audit.id, audit.actor, audit.target_kind, audit.target_key, audit.reason) == (
        audit_id,
        "ops-alice",
        "schedule",
        WEEKLY,
        "s1 died with the store",
    )
    details = json.loads(audit.details or "{}")
    assert (details["period"], details["owner"], details["owner_before"]) == (
        "2026-W34",
        "ops",
        "s1",
    ), details
    assert store.schedule_run_take_over(take) is None  # the run moved on: once


def test_schedule_run_list_is_newest_first_and_limited(store: Store):
    for n, period in enumerate(("2026-W32", "2026-W33", "2026-W34")):
        store.schedule_run_claim(claim("s1", period))
        store.schedule_run_finish(WEEKLY, period, "s1", eligible=n, enqueued=n)
        advance(store, timedelta(days=7))
    assert [r.period for r in store.schedule_run_list(WEEKLY)] == [
        "2026-W34",
        "2026-W33",
        "2026-W32",
    ]
    assert [r.period for r in store.schedule_run_list(WEEKLY, limit=1)] == ["2026-W34"]
    assert store.schedule_run_list("other") == []


def fan_out(store: Store, owner: str, customers: list[int]) -> tuple[list[int], bool]:
    result = store.job_insert_many(
        JobInsertMany(
            task="digest",
            queue="default",
            priority=0,
            max_attempts=1,
            rows=[
                (f"digest/{c}/2026-W34", json.dumps({"customer": c}), None, None) for c in customers
            ],
            for_run=ScheduleRunRef(WEEKLY, "2026-W34", owner, LEASE),
        )
    )
    return [job_id for job_id, _key in result.created], result.run_held


def test_job_insert_many_for_a_run_tags_its_jobs_and_counts_them_with_the_run(store: Store):
    store.schedule_run_claim(claim("s1"))
    advance(store, timedelta(minutes=2))
    ids, held = fan_out(store, "s1", [1, 2, 3])
    assert held is True and len(ids) == 3
    again, _held = fan_out(store, "s1", [3, 4])  # customer 3's job exists already
    assert len(again) == 1
    [run] = store.schedule_run_list(WEEKLY)
    assert (run.enqueued_count, run.lease_expires_at) == (4, T0 + timedelta(minutes=7))
    tagged = [row(store, j) for j in ids + again]
    assert {(j.schedule, j.period) for j in tagged} == {(WEEKLY, "2026-W34")}


def test_job_insert_many_for_a_run_taken_over_says_so_and_counts_nothing_for_it(store: Store):
    store.schedule_run_claim(claim("s1"))
    advance(store, LEASE + timedelta(seconds=1))
    store.schedule_run_claim(claim("s2"))
    _ids, held = fan_out(store, "s1", [1, 2])  # the old owner, still running
    assert held is False
    [run] = store.schedule_run_list(WEEKLY)
    assert (run.owner, run.lease_expires_at, run.enqueued_count) == (
        "s2",
        T0 + LEASE * 2 + timedelta(seconds=1),
        0,
    )


def test_schedule_period_stats_shows_a_periods_jobs_and_messages_against_its_eligible(
    store: Store,
):
    store.schedule_run_claim(claim("s1"))
    ids, _held = fan_out(store, "s1", [1, 2, 3, 4])
    store.schedule_run_finish(WEEKLY, "2026-W34", "s1", eligible=5, enqueued=0)
    with opened_session(store) as session:
        token, leased = lease(session, tasks=("digest",), limit=3)
        assert leased == ids[:3]
        with session.transaction() as tx:
            tx.outbox_insert(
                [outbox_insert(f"digest/{c}/2026-W34", job_id=ids[c - 1]) for c in (1, 2)]
            )
            tx.job_finish(
                token,
                [
                    JobFinish(ids[0], "done", outcome="completed"),
                    JobFinish(ids[1], "done", outcome="completed"),
                    JobFinish(ids[2], "dead", error="poison"),
                ],
            )
    sent_id = store.outbox_find_by_key("digest/1/2026-W34")[0].id
    finish_outbox(store, sent_id, OutboxFinish(sent_id, "sent", "sent", True, receipt="r"))
    resent_id = store.outbox_find_by_key("digest/2/2026-W34")[0].id
    finish_outbox(  # a resend after an unknown outcome: a possible duplicate
        store,
        resent_id,
        OutboxFinish(
            resent_id, "pending", "resent", True, error="timeout", possible_duplicate=True
        ),
    )
    [stats] = store.schedule_period_stats(WEEKLY)
    assert (stats.period, stats.state, stats.eligible, stats.enqueued) == ("2026-W34", "done", 5, 4)
    assert (stats.done, stats.covered, stats.sent) == (2, 1, 1)
    assert (stats.pending, stats.dead, stats.ambiguous) == (2, 1, 0)  # a ready job, a message
    assert stats.duplicates == 1
    assert stats.coverage == 1 / 5
    assert store.schedule_period_stats("other") == []


def test_schedule_slo_set_records_an_slo_once_and_clears_it(store: Store):
    store.schedule_state(WEEKLY, grace=timedelta(0))
    store.schedule_state("other", grace=timedelta(0))
    store.schedule_slo_set(WEEKLY, timedelta(hours=4), 0.995)
    store.schedule_slo_set(WEEKLY, timedelta(hours=4), 0.995)  # unchanged: nothing written
    assert store.schedule_slo_list() == {WEEKLY: (timedelta(hours=4), 0.995)}
    store.schedule_slo_set(WEEKLY, None, None)  # the code no longer declares one
    assert store.schedule_slo_list() == {}


def test_schedule_period_stats_with_a_window_counts_the_jobs_covered_in_time(store: Store):
    store.schedule_run_claim(claim("s1"))  # fired 30 s before T0
    ids, _held = fan_out(store, "s1", [1, 2, 3])
    store.schedule_run_finish(WEEKLY, "2026-W34", "s1", eligible=3, enqueued=0)
    with opened_session(store) as session:
        token, _ = lease(session, tasks=("digest",), limit=3)
        with session.transaction() as tx:
            tx.outbox_insert(
                [outbox_insert(f"digest/{c}/2026-W34", job_id=ids[c - 1]) for c in (1, 2)]
            )
            done = [JobFinish(job_id, "done", outcome="completed") for job_id in ids]
            tx.job_finish(token, done)  # job 3 wrote nothing: covered when done, at T0
    first = store.outbox_find_by_key("digest/1/2026-W34")[0].id
    finish_outbox(store, first, OutboxFinish(first, "sent", "sent", True, receipt="r1"))
    advance(store, timedelta(hours=2))
    second = store.outbox_find_by_key("digest/2/2026-W34")[0].id
    finish_outbox(store, second, OutboxFinish(second, "sent", "sent", True, receipt="r2"))
    [hour] = store.schedule_period_stats(WEEKLY, window=timedelta(hours=1))
    [day] = store.schedule_period_stats(WEEKLY, window=timedelta(days=1))
    [none] = store.schedule_period_stats(WEEKLY)
    assert hour.fire_at == T0 - timedelta(seconds=30)
    assert (hour.covered, hour.on_time, day.on_time, none.on_time) == (3, 2, 3, None)


def test_schedule_period_pace_measures_completions_from_first_lease_to_last(store: Store):
    store.schedule_run_claim(claim("s1"))
    ids, _held = fan_out(store, "s1", [1, 2, 3])
    assert store.schedule_period_pace(WEEKLY, "2026-W34").done == 0
    with opened_session(store) as session:
        token, _ = lease(session, tasks=("digest",), limit=2)
        advance(store, timedelta(minutes=10))
        with session.transaction() as tx:
            tx.job_finish(token, [JobFinish(i, "done", outcome="completed") for i in ids[:2]])
    pace = store.schedule_period_pace(WEEKLY, "2026-W34")
    assert (pace.done, pace.lanes) == (2, 1)
    assert (pace.first_at, pace.last_at) == (T0, T0 + timedelta(minutes=10))


def test_schedule_period_stats_count_pruned_jobs_as_the_runs_summary_kept_them(store: Store):
    """A year later, "did everyone get W34?" still has its answer: what each
    pruned job counted is added to its run in the prune's transaction. A job with a message not
    yet sent is kept until it is: its figures could still change."""
    store.schedule_state(WEEKLY, grace=timedelta(0))
    store.schedule_slo_set(WEEKLY, timedelta(hours=1), 0.99)
    store.schedule_run_claim(claim("s1"))  # fired 30 s before T0
    ids, _held = fan_out(store, "s1", [1, 2, 3, 4])
    store.schedule_run_finish(WEEKLY, "2026-W34", "s1", eligible=4, enqueued=0)
    with opened_session(store) as session:
        token, _ = lease(session, tasks=("digest",), limit=4)
        with session.transaction() as tx:
            tx.outbox_insert(
                [outbox_insert(f"digest/{c}/2026-W34", job_id=ids[c - 1]) for c in (1, 2, 3)]
            )
            tx.job_finish(token, [JobFinish(i, "done", outcome="completed") for i in ids])
    messages = {c: store.outbox_find_by_key(f"digest/{c}/2026-W34")[0].id for c in (1, 2, 3)}
    finish_outbox(store, messages[1], OutboxFinish(messages[1], "sent", "sent", True))
    advance(store, timedelta(hours=2))
    finish_outbox(store, messages[2], OutboxFinish(messages[2], "sent", "sent", True))
    window = timedelta(hours=1)
    [before] = store.schedule_period_stats(WEEKLY, window=window)
    assert (before.done, before.covered, before.sent, before.pending) == (4, 3, 2, 1)
    assert (before.on_time, before.pruned) == (2, 0)  # 1 sent in time; 4 wrote nothing

    advance(store, timedelta(days=8))
    # job 3 stays: its message is pending
    assert store.job_prune("digest", timedelta(days=7), limit=100) == 3
    assert store.job_prune("digest", timedelta(days=7), limit=100) == 0
    assert [store.job_get(i) is None for i in ids] == [True, True, False, True]
    [after] = store.schedule_period_stats(WEEKLY, window=window)
    assert after == dataclasses.replace(before, pruned=3)

    finish_outbox(store, messages[3], OutboxFinish(messages[3], "sent", "sent", True))
    assert store.job_prune("digest", timedelta(days=7), limit=100) == 1
    [final] = store.schedule_period_stats(WEEKLY, window=window)
    assert (final.done, final.covered, final.sent, final.pending) == (4, 4, 3, 0)
    assert (final.on_time, final.pruned, final.coverage) == (2, 4, 1.0)  # 3 was sent 8 days late
