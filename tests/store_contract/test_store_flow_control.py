"""Limits on tasks and debounces, on every store: a limited task's jobs are leased only while
their limits have room — slots counted as leased jobs, rates from buckets on the store's clock —
and the jobs no limit holds are leased beside them as before; an enqueue of a debounced task
joins the pending job of its debounce key. Time is the store's frozen clock."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.jobs.declarations import LAPSE
from oncebox.jobs.limits import Concurrency, Rate, plan_of, task_limits
from oncebox.kernel.errors import ConfigurationError
from oncebox.store.params import Collapsing, JobFinish, LimitDeclaration, LimitPlan
from oncebox.store.protocol import Store
from support.contract import LEASE, T0, advance, insert, job, lease, opened_session, row

PARAMS = {"tenant", "n"}


def plan(**tasks: list[Concurrency | Rate]) -> LimitPlan:
    """The plan of tasks declared with these limits (partitioned by "{tenant}" when one is)."""
    declared = {}
    for task, limits in tasks.items():
        partition = "{tenant}" if any(limit.per_partition for limit in limits) else None
        found = task_limits(task, limits, partition, PARAMS)
        assert found is not None
        declared[task] = found
    return plan_of(declared)


def limited(store: Store, key: str, partition: str = "", task: str = "t", **fields) -> int:
    return insert(store, key, task, limit_key=partition, **fields)


def finish(store: Store, token: str, job_id: int) -> None:
    with opened_session(store) as session, session.transaction() as tx:
        assert tx.job_finish(token, [JobFinish(job_id, "done", "completed")]) == {job_id}


def test_a_concurrency_limit_leases_only_as_many_jobs_as_it_has_free_slots(store: Store):
    limits = plan(t=[Concurrency(2)])
    ids = [limited(store, f"k/{n}") for n in range(5)]
    free = insert(store, "k/free", "u")
    with opened_session(store) as session:
        token, first = lease(session, tasks=("t", "u"), limits=limits)
        assert first == [*ids[:2], free]  # two slots, and the job no limit holds beside them
        assert lease(session, limits=limits)[1] == []  # both slots taken, whoever asks
        finish(store, token, ids[0])
        assert lease(session, limits=limits)[1] == [ids[2]]  # a settled job frees its slot
        assert lease(session, limits=limits)[1] == []


def test_a_slot_held_by_a_lease_that_ran_out_frees_when_the_rescuer_ends_it(store: Store):
    limits = plan(t=[Concurrency(1)])
    first, second = limited(store, "k/1"), limited(store, "k/2")
    with opened_session(store) as session:
        assert lease(session, limits=limits, worker="killed")[1] == [first]
        advance(store, LEASE + timedelta(seconds=1))
        assert lease(session, limits=limits)[1] == []  # past its deadline, still held
        [rescued] = store.job_rescue_expired(limit=10)
        assert (rescued.id, rescued.state) == (first, "ready")
        # the freed slot goes to the next in line (the rescued job is due again from now)
        assert lease(session, limits=limits)[1] == [second]
        assert row(store, first).state == "ready"


def test_per_partition_slots_share_out_a_global_limit_among_partitions(store: Store):
    limits = plan(t=[Concurrency(3), Concurrency(1, per_partition=True)])
    a = [limited(store, f"k/a{n}", "a") for n in range(3)]
    b = [limited(store, f"k/b{n}", "b") for n in range(3)]
    with opened_session(store) as session:
        token, first = lease(session, limits=limits)
        assert first == [a[0], b[0]]  # one per partition, though the global limit allows 3
        assert lease(session, limits=limits)[1] == []
        c = limited(store, "k/c0", "c")
        d = limited(store, "k/d0", "d")
        assert lease(session, limits=limits)[1] == [c]  # the third global slot, oldest first
        assert lease(session, limits=limits)[1] == []
        assert row(store, d).state == "ready"
        finish(store, token, a[0])
        assert lease(session, limits=limits)[1] == [a[1]]  # a's slot and a global one freed


def test_a_rate_limit_spends_a_token_per_lease_and_says_when_the_next_one_is_due(store: Store):
    limits = plan(t=[Rate("2/s")])
    ids = [limited(store, f"k/{n}") for n in range(5)]
    with opened_session(store) as session:
        assert lease(session, limits=limits)[1] == ids[:2]  # a full bucket of two
        assert lease(session, limits=limits)[1] == []
        due = session.due_seen()
        assert due is not None and due.seconds() == 0.5  # a token refills in half a second
        advance(store, timedelta(milliseconds=500))
        assert lease(session, limits=limits)[1] == [ids[2]]
        advance(store, timedelta(seconds=10))  # a bucket holds at most its capacity
        assert lease(session, limits=limits)[1] == ids[3:5]


def test_per_partition_rates_keep_a_bucket_for_each_partition(store: Store):
    limits = plan(t=[Rate("1/min", per_partition=True)])
    a = [limited(store, f"k/a{n}", "a") for n in range(2)]
    b = [limited(store, f"k/b{n}", "b") for n in range(2)]
    with opened_session(store) as session:
        assert lease(session, limits=limits)[1] == [a[0], b[0]]
        assert lease(session, limits=limits)[1] == []
        advance(store, timedelta(minutes=1))
        assert lease(session, limits=limits)[1] == [a[1], b[1]]


def test_a_rate_limited_task_is_leased_in_batches_beside_the_jobs_no_limit_holds(store: Store):
    limits = plan(t=[Rate("2/s")])
    held = [limited(store, f"k/t{n}", priority=5) for n in range(3)]
    free = [insert(store, f"k/u{n}", "u") for n in range(3)]
    with opened_session(store) as session:
        leased = lease(session, tasks=("t", "u"), limits=limits, limit=4)[1]
        assert leased == [*held[:2], *free[:2]]  # the limited jobs first, then the rest


def test_a_limit_named_on_two_tasks_is_one_limit_over_both(store: Store):
    api = Concurrency(2, name="provider-api")
    limits = plan(t=[api], u=[api])
    t = limited(store, "k/t", task="t")
    u = [limited(store, f"k/u{n}", task="u") for n in range(2)]
    with opened_session(store) as session:
        assert lease(session, tasks=("t",), limits=limits)[1] == [t]
        # a worker serving only u still counts t's leased job against the shared limit
        assert lease(session, tasks=("u",), limits=limits)[1] == [u[0]]
        assert lease(session, tasks=("t", "u"), limits=limits)[1] == []


def test_jobs_no_limit_holds_are_leased_beside_a_saturated_limited_backlog(store: Store):
    limits = plan(t=[Concurrency(1)])
    held = [limited(store, f"k/t{n}", priority=5) for n in range(20)]
    free = [insert(store, f"k/u{n}", "u") for n in range(3)]
    with opened_session(store) as session:
        leased = lease(session, tasks=("t", "u"), limits=limits, limit=3)[1]
        assert leased == [held[0], free[0], free[1]]  # the limited job first, then the rest
        assert lease(session, tasks=("t", "u"), limits=limits, limit=3)[1] == [free[2]]


def test_a_limited_job_is_never_leased_by_a_lease_that_does_not_apply_its_limits(store: Store):
    job_id = limited(store, "k/1")
    with opened_session(store) as session:
        assert lease(session)[1] == []  # e.g. a worker of a release before the limit
        assert lease(session, limits=plan(t=[Concurrency(1)]))[1] == [job_id]


def test_a_limited_partition_is_leased_in_claim_order_and_waits_for_its_due_time(store: Store):
    limits = plan(t=[Concurrency(2)])
    later = limited(store, "k/later", delay=timedelta(minutes=5), priority=9)
    low = limited(store, "k/low", priority=0)
    high = limited(store, "k/high", priority=3)
    with opened_session(store) as session:
        assert lease(session, limits=limits, limit=1)[1] == [high]
        assert lease(session, limits=limits)[1] == [low]
        assert lease(session, limits=limits)[1] == []  # the slots are taken...
        due = session.due_seen()
        assert due is not None and due.at is None  # ...so no time says when: a settle frees one
    with opened_session(store) as session:
        limits = plan(t=[Concurrency(5)])
        assert lease(session, limits=limits)[1] == []
        due = session.due_seen()
        assert due is not None and due.seconds() == 300  # room, and the next job due in 5 min
        advance(store, timedelta(minutes=5))
        assert lease(session, limits=limits)[1] == [later]


def test_an_ordered_group_of_a_limited_task_still_runs_one_job_at_a_time(store: Store):
    limits = plan(t=[Concurrency(5)])
    first = limited(store, "k/1", group_key="g")
    limited(store, "k/2", group_key="g")
    other = limited(store, "k/3", group_key="h")
    with opened_session(store) as session:
        assert lease(session, limits=limits)[1] == [first, other]
        assert lease(session, limits=limits)[1] == []


def test_a_limit_shared_by_name_must_be_declared_the_same_everywhere():
    try:
        plan(t=[Concurrency(2, name="api")], u=[Concurrency(3, name="api")])
    except ConfigurationError as exc:
        assert "limit 'api' is declared differently by tasks 't' and 'u'" in str(exc)
    else:
        raise AssertionError("two different limits under one name were accepted")


def collapsing(throttle: bool = False, keep_last: bool = True) -> Collapsing:
    return Collapsing(
        key="t/1",
        throttle=throttle,
        window=timedelta(seconds=30),
        max_wait=timedelta(minutes=1),
        keep_last=keep_last,
    )


def test_job_merge_joins_only_a_pending_job_of_its_debounce_key(store: Store):
    pending = job("k/1", collapse=collapsing())
    assert store.job_merge(pending) is None  # nothing pending yet
    job_id, created = store.job_insert(pending)
    assert created and row(store, job_id).run_at == T0 + timedelta(seconds=30)
    advance(store, timedelta(seconds=20))
    later = job("k/2", args={"n": 2}, collapse=collapsing())
    assert store.job_merge(later) == (job_id, "k/2")
    merged = row(store, job_id)
    assert (merged.key, merged.args_json, merged.run_at) == (
        "k/2",
        '{"n": 2}',
        T0 + timedelta(seconds=50),  # a window from the last enqueue...
    )
    advance(store, timedelta(seconds=20))
    assert store.job_merge(later) == (job_id, "k/2")
    assert row(store, job_id).run_at == T0 + timedelta(minutes=1)  # ...at most max_wait on
    with opened_session(store) as session:
        advance(store, timedelta(minutes=1))
        assert lease(session)[1] == [job_id]
    assert store.job_merge(later) is None  # leased: no longer pending
    assert store.counter_list()["enqueue_collapsed"] == 2


def test_job_merge_keeps_the_first_arguments_and_never_takes_a_key_held_elsewhere(store: Store):
    first = job("k/1", collapse=collapsing(keep_last=False))
    job_id, _ = store.job_insert(first)
    assert store.job_merge(job("k/9", args={"n": 9}, collapse=collapsing(keep_last=False))) == (
        job_id,
        "k/1",
    )
    assert (row(store, job_id).key, row(store, job_id).args_json) == ("k/1", '{"n": 1}')
    held = insert(store, "k/taken", "other")
    taking = job("k/taken", collapse=collapsing())
    assert store.job_merge(taking) is None  # k/taken is another job's
    assert store.job_insert(taking) == (0, False)  # and so the enqueue is a duplicate
    assert row(store, job_id).key == "k/1" and row(store, held).key == "k/taken"


def test_a_collapsed_insert_beside_a_pending_job_writes_nothing(store: Store):
    store.job_insert(job(None, collapse=collapsing()))
    assert store.job_insert(job(None, collapse=collapsing())) == (0, False)  # merge instead
    assert store.job_count_by_state()["ready"] == 1


def test_a_throttled_job_is_due_a_window_after_the_one_before_it(store: Store):
    throttled = job(None, collapse=collapsing(throttle=True))
    first, _ = store.job_insert(throttled)
    assert row(store, first).run_at == T0  # none before it: at once
    assert store.job_merge(throttled) == (first, None)
    assert row(store, first).run_at == T0  # joining never moves a throttled job
    with opened_session(store) as session:
        assert lease(session)[1] == [first]
    second, created = store.job_insert(throttled)
    assert created and row(store, second).run_at == T0 + timedelta(seconds=30)


def test_job_limited_waiting_counts_what_each_partition_holds_back_within_its_bounds(
    store: Store,
):
    for n in range(4):
        limited(store, f"k/a{n}", "a")
    advance(store, timedelta(minutes=1))
    limited(store, "k/b0", "b")
    limited(store, "k/c0", "c", delay=timedelta(hours=1))  # not due: not waiting
    with opened_session(store) as session:
        assert lease(session, limits=plan(t=[Concurrency(3)]), limit=1)[1] == [1]
    advance(store, timedelta(minutes=1))
    found = {p.partition: p for p in store.job_limited_waiting(["t"], cap=2, partitions=10)}
    assert set(found) == {"a", "b", "c"}
    a, b, c = found["a"], found["b"], found["c"]
    assert (a.waiting, a.leased, a.oldest) == (2, 1, T0)  # counted up to the cap
    assert (b.waiting, b.leased, b.oldest) == (1, 0, T0 + timedelta(minutes=1))
    assert (c.waiting, c.leased, c.oldest) == (0, 0, None)
    assert [p.partition for p in store.job_limited_waiting(["t"], cap=2, partitions=1)] == ["a"]


def test_jobs_of_a_task_whose_limits_were_dropped_go_back_to_the_unlimited_lease(store: Store):
    tagged = limited(store, "k/1", "a")
    with opened_session(store) as session:
        assert lease(session)[1] == []  # the task declares no limit now: nobody takes it yet
        assert store.job_unlimit(["t"], 10, LAPSE) == 1  # the rescuer's pass
        assert store.job_unlimit(["t"], 10, LAPSE) == 0
        assert lease(session)[1] == [tagged]


def test_a_task_some_process_declared_limited_within_the_lapse_keeps_its_jobs_limited(
    store: Store,
):
    tagged = limited(store, "k/1", "a")
    declared = LimitDeclaration("t", '{"limits":[["t:concurrency","1 at once"]]}')
    second = timedelta(seconds=1)
    store.limit_declare([declared])
    advance(store, LAPSE - second)
    assert store.job_unlimit(["t"], 10, LAPSE) == 0  # declared 9:59 ago
    store.limit_declare([declared])  # a beat of a worker of the release that limits it
    advance(store, -timedelta(minutes=15))
    store.limit_declare([declared])  # a clock behind never moves a declaration back
    [seen] = store.limit_declaration_list()
    assert (seen.task, json.loads(seen.limits), seen.declared_at) == (
        "t",
        json.loads(declared.limits),
        T0 + LAPSE - second,
    )
    advance(store, timedelta(minutes=15) + LAPSE - second)
    assert store.job_unlimit(["t"], 10, LAPSE) == 0  # refreshed 9:59 ago
    advance(store, 2 * second)  # no declaration for longer than the lapse
    assert store.job_unlimit(["t"], 10, LAPSE) == 1
    assert row(store, tagged).state == "ready"


def test_a_limited_tasks_job_without_a_partition_is_leased_around_its_limit(store: Store):
    limits = plan(t=[Concurrency(1)])
    untagged = insert(store, "k/old")  # enqueued before the task was limited
    tagged = limited(store, "k/new")
    with opened_session(store) as session:
        assert lease(session, limits=limits)[1] == [tagged, untagged]
        assert lease(session, limits=limits)[1] == []
