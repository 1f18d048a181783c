"""The consumer transaction on every store: one intent per key, all or nothing."""

from __future__ import annotations

import multiprocessing
import threading
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import Box, ConsumerConfig, DrainFailed, Permanent, Retry, RetryLater
from oncebox.kernel import points
from oncebox.lanes.consumer import ConsumerResult
from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.lanes.pruner import Pruner, PrunerConfig
from oncebox.testing import FrozenClock, RedeliveringTransport, drain
from support.db import create_effects, effects, record_effect
from support.procs import broker_consumer
from support.rows import job_attempts, job_row

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
KEY = "weekly-digest/customer-42/2026-W33"
SPAWN = multiprocessing.get_context("spawn")


def digest_task(box: Box, fail_for: set[int] | None = None, retry: Retry | None = None):
    create_effects(box)

    @box.task(key="weekly-digest/customer-{customer_id}/{period}", retry=retry)
    def weekly_digest(ctx, customer_id: int, period: str) -> None:
        record_effect(ctx, f"attempt-{ctx.attempt}")
        if fail_for and customer_id in fail_for:
            raise RuntimeError(f"customer {customer_id} failed")

    return weekly_digest


def consume(box: Box, transport: RedeliveringTransport, **config):
    consumer = box.consumer(ConsumerConfig(**config), transport=transport)
    try:
        return consumer.run_once()
    finally:
        consumer.session.close()


def test_the_same_message_delivered_twice_completes_then_is_a_duplicate(box: Box):
    digest_task(box)
    broker = RedeliveringTransport(copies=2)
    broker.publish("weekly_digest", customer_id=42, period="2026-W33")
    first = consume(box, broker, batch_size=1)
    second = consume(box, broker, batch_size=1)
    assert (first.completed, first.duplicates) == (1, 0)
    assert (second.completed, second.duplicates) == (0, 1)
    assert effects(box) == [(KEY, "attempt-1")]
    assert [outcome for _id, outcome in broker.acks] == ["completed", "duplicate"]
    assert box.metrics.counter("claim_conflicts") == 1


def test_a_redelivery_in_a_later_process_is_still_a_duplicate(store_url: str):
    first = Box(store_url)
    try:
        digest_task(first)
        broker = RedeliveringTransport(copies=1)
        broker.publish("weekly_digest", customer_id=42, period="2026-W33")
        assert consume(first, broker).completed == 1
    finally:
        first.close()
    results, barrier = SPAWN.Queue(), SPAWN.Barrier(1)
    later = SPAWN.Process(
        target=broker_consumer, args=(store_url, [("weekly_digest", "42")], barrier, results)
    )
    later.start()
    later.join(60)
    assert later.exitcode == 0
    _pid, completed, duplicates = results.get(timeout=10)
    assert (completed, duplicates) == (0, 1)
    check = Box(store_url)
    try:
        assert effects(check) == [(KEY, "attempt-1")]
    finally:
        check.close()


def test_a_table_job_whose_key_was_claimed_elsewhere_completes_as_duplicate(box: Box):
    task = digest_task(box)
    job = box.enqueue(task, customer_id=42, period="2026-W33")
    broker = RedeliveringTransport(copies=1)
    broker.publish("weekly_digest", customer_id=42, period="2026-W33")
    assert consume(box, broker).completed == 1
    result = drain(box)
    assert (result.completed, result.duplicates) == (0, 1)
    row = job_row(box, job.job_id)
    assert (row.state, row.outcome) == ("done", "duplicate")
    assert len(effects(box)) == 1


def test_a_failed_handler_leaves_no_intent_no_writes_and_costs_others_nothing(box: Box):
    task = digest_task(box, fail_for={2}, retry=Retry(max_attempts=3))
    with FrozenClock(box, at=T0):
        for customer in (1, 2, 3):
            box.enqueue(task, customer_id=customer, period="2026-W33")
        result = drain(box, raise_on_failure=False)
    assert (result.completed, result.retried) == (2, 1)
    assert [key for key, _note in effects(box)] == [
        "weekly-digest/customer-1/2026-W33",
        "weekly-digest/customer-3/2026-W33",
    ]
    assert box.store.intent_get("weekly-digest/customer-2/2026-W33") is None
    assert box.store.intent_count() == 2
    failed = box.find("weekly-digest/customer-2/2026-W33")[0]
    assert (failed.state, failed.attempt) == ("ready", 1)
    others = [box.find(f"weekly-digest/customer-{c}/2026-W33")[0] for c in (1, 3)]
    assert [(j.state, j.attempt) for j in others] == [("done", 1), ("done", 1)]


def test_drain_raises_with_every_failed_attempt(box: Box):
    task = digest_task(box, fail_for={5})
    box.enqueue(task, customer_id=5, period="2026-W33")
    with pytest.raises(
        DrainFailed, match=r"weekly-digest/customer-5/2026-W33 .* customer 5 failed"
    ):
        drain(box)


@pytest.mark.parametrize("how", ["commit", "rollback", "sql", "with", "close"])
def test_a_handler_cannot_commit_or_roll_back_the_claim(box: Box, how: str):
    create_effects(box)

    @box.task(key="sneaky/{n}", retry=Retry(max_attempts=1))
    def sneaky(ctx, n: int) -> None:
        record_effect(ctx, "before")
        if how == "commit":
            ctx.connection.commit()
        elif how == "rollback":
            ctx.connection.rollback()
        elif how == "sql":
            ctx.connection.execute("  /* hi */ COMMIT")
        elif how == "close":
            ctx.connection.close()
        else:
            with ctx.connection:
                pass

    box.enqueue(sneaky, n=1)
    result = drain(box, raise_on_failure=False)
    assert result.dead == 1
    assert "TransactionControlRefused" in result.failures[0].error
    assert effects(box) == []
    assert box.store.intent_count() == 0


def test_args_that_fail_the_signature_are_dead_after_one_attempt(store_url: str):
    producer = Box(store_url)
    consumer_box = Box(store_url)
    try:

        @producer.task(key="invoice/{invoice_id}", name="send_invoice")
        def old_shape(ctx, invoice_id: int, currency: str) -> None:
            pass

        @consumer_box.task(key="invoice/{invoice_id}", name="send_invoice")
        def new_shape(ctx, invoice_id: int) -> None:
            raise AssertionError("must not run with arguments that do not fit")

        job = producer.enqueue(old_shape, invoice_id=1, currency="EUR")
        result = drain(consumer_box, raise_on_failure=False)
        assert result.dead == 1
        row = job_row(consumer_box, job.job_id)
        assert (row.state, row.attempt) == ("dead", 1)
        assert "unexpected keyword argument 'currency'" in (row.last_error or "")
        attempts = job_attempts(consumer_box, job.job_id)
        assert [(a.attempt, a.outcome) for a in attempts] == [(1, "dead")]
    finally:
        producer.close()
        consumer_box.close()


def test_a_job_of_an_unknown_task_is_left_for_a_worker_that_knows_it(store_url: str):
    other = Box(store_url)
    mine = Box(store_url)
    try:

        @other.task(key="other/{n}")
        def other_task(ctx, n: int) -> None:
            pass

        @mine.task(key="mine/{n}")
        def mine_task(ctx, n: int) -> None:
            pass

        job = other.enqueue(other_task, n=1)
        mine.enqueue(mine_task, n=1)
        assert drain(mine).completed == 1
        row = job_row(mine, job.job_id)
        assert (row.state, row.attempt) == ("ready", 0)
        assert drain(other).completed == 1
    finally:
        other.close()
        mine.close()


def test_retry_schedule_under_the_frozen_clock(box: Box):
    policy = Retry(
        max_attempts=3, base_delay=timedelta(seconds=10), max_delay=timedelta(seconds=15)
    )
    task = digest_task(box, fail_for={9}, retry=policy)
    with FrozenClock(box, at=T0) as clock:
        job = box.enqueue(task, customer_id=9, period="2026-W33").job_id
        bounds = {1: 10, 2: 15}
        for attempt in (1, 2):
            result = drain(box, raise_on_failure=False)
            assert result.retried == 1
            row = job_row(box, job)
            assert (row.state, row.attempt) == ("ready", attempt)
            now = clock.instant
            assert now <= row.run_at <= now + timedelta(seconds=bounds[attempt])
            assert drain(box, raise_on_failure=False).leased == 0  # not due yet
            clock.set(row.run_at)
        result = drain(box, raise_on_failure=False)
        assert result.dead == 1
    row = job_row(box, job)
    assert (row.state, row.attempt) == ("dead", 3)
    attempts = job_attempts(box, job)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "failed"), (2, "failed"), (3, "dead")]
    assert all("customer 9 failed" in (a.error or "") for a in attempts)
    assert effects(box) == []


def test_retry_later_and_permanent_are_honoured(box: Box):
    @box.task(key="job/{n}", retry=Retry(max_attempts=5))
    def signalling(ctx, n: int) -> None:
        if n == 1:
            raise RetryLater("provider busy", delay=timedelta(minutes=7))
        raise Permanent("recipient does not exist")

    with FrozenClock(box, at=T0):
        later = box.enqueue(signalling, n=1).job_id
        never = box.enqueue(signalling, n=2).job_id
        drain(box, raise_on_failure=False)
    assert job_row(box, later).run_at == T0 + timedelta(minutes=7)
    dead = job_row(box, never)
    assert (dead.state, dead.attempt) == ("dead", 1)
    assert "recipient does not exist" in (dead.last_error or "")


def test_max_age_makes_a_late_failure_final(box: Box):
    @box.task(key="job/{n}", retry=Retry(max_attempts=10, max_age=timedelta(minutes=5)))
    def flaky(ctx, n: int) -> None:
        raise RetryLater("not yet", delay=timedelta(minutes=3))

    with FrozenClock(box, at=T0) as clock:
        job = box.enqueue(flaky, n=1).job_id
        drain(box, raise_on_failure=False)
        assert job_row(box, job).state == "ready"
        clock.advance(timedelta(minutes=3))
        drain(box, raise_on_failure=False)
    row = job_row(box, job)
    assert (row.state, row.attempt) == ("dead", 2)
    assert "max age reached" in (row.last_error or "")


def test_replay_keeps_key_and_id_appends_history_and_is_audited(box: Box):
    fail_for = {4}
    task = digest_task(box, fail_for=fail_for, retry=Retry(max_attempts=2, base_delay=timedelta(0)))
    with FrozenClock(box, at=T0):
        job = box.enqueue(task, customer_id=4, period="2026-W33").job_id
        drain(box, raise_on_failure=False)
        drain(box, raise_on_failure=False)
        assert job_row(box, job).state == "dead"
        fail_for.clear()
        outcome = box.replay(
            "weekly-digest/customer-4/2026-W33", reason="provider fixed", actor="ops"
        )
        assert outcome.id == job
        assert drain(box).completed == 1
    row = job_row(box, job)
    assert (row.id, row.key, row.state, row.outcome, row.attempt) == (
        job,
        "weekly-digest/customer-4/2026-W33",
        "done",
        "completed",
        3,
    )
    assert [(a.attempt, a.outcome) for a in job_attempts(box, job)] == [
        (1, "failed"),
        (2, "dead"),
    ]
    audit = box.store.audit_list(target_id=job)
    assert [(a.action, a.actor, a.reason, a.target_key) for a in audit] == [
        ("replay", "ops", "provider fixed", "weekly-digest/customer-4/2026-W33"),
    ]
    assert effects(box) == [("weekly-digest/customer-4/2026-W33", "attempt-3")]


def test_replaying_a_job_whose_key_was_claimed_meanwhile_completes_as_duplicate(box: Box):
    task = digest_task(box, fail_for={6}, retry=Retry(max_attempts=1))
    job = box.enqueue(task, customer_id=6, period="2026-W33").job_id
    drain(box, raise_on_failure=False)
    assert job_row(box, job).state == "dead"
    # the same operation arrives by another route and succeeds
    other = Box(box.store.url)
    try:

        @other.task(key="weekly-digest/customer-{customer_id}/{period}")
        def weekly_digest(ctx, customer_id: int, period: str) -> None:
            record_effect(ctx, "other route")

        broker = RedeliveringTransport(copies=1)
        broker.publish("weekly_digest", customer_id=6, period="2026-W33")
        assert consume(other, broker).completed == 1
    finally:
        other.close()
    assert job is not None
    box.replay(job, reason="redrive")
    assert drain(box).duplicates == 1
    assert effects(box) == [("weekly-digest/customer-6/2026-W33", "other route")]


def test_replay_refuses_jobs_that_are_not_dead(box: Box):
    from oncebox import InvalidState, NotFound

    task = digest_task(box)
    box.enqueue(task, customer_id=1, period="2026-W33")
    with pytest.raises(InvalidState, match="is ready; only dead"):
        box.replay("weekly-digest/customer-1/2026-W33", reason="x")
    with pytest.raises(NotFound):
        box.replay("weekly-digest/customer-404/2026-W33", reason="x")
    from oncebox import ConfigurationError

    with pytest.raises(ConfigurationError, match="reason is required"):
        box.replay("weekly-digest/customer-1/2026-W33", reason="  ")


def test_ordered_group_runs_in_order_and_a_failing_head_blocks_only_its_group(box: Box):
    ran: list[str] = []
    failing = {"a1"}

    @box.task(key="step/{name}", group_by="customer", retry=Retry(max_attempts=2))
    def step(ctx, customer: str, name: str) -> None:
        ran.append(name)
        if name in failing:
            raise RetryLater("not yet", delay=timedelta(minutes=1))

    with FrozenClock(box, at=T0) as clock:
        for customer, name in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("a", "a3"), ("b", "b2")]:
            box.enqueue(step, customer=customer, name=name)
        drain(box, raise_on_failure=False)
        assert ran == ["a1", "b1", "b2"]  # a2 and a3 wait behind their failing head
        clock.advance(timedelta(minutes=1))
        drain(box, raise_on_failure=False)  # a1 fails again: its last attempt → dead
        assert box.find("step/a1")[0].state == "dead"
        drain(box)  # the dead head unblocks its group, in enqueue order
    assert ran == ["a1", "b1", "b2", "a1", "a2", "a3"]


def test_a_superseded_worker_commits_nothing_and_its_attempt_is_recorded(box: Box):
    task = digest_task(box)
    pause = points.Pause(only=lambda thread: thread == "worker-A", timeout=20)
    outcome: dict[str, ConsumerResult] = {}
    with FrozenClock(box, at=T0) as clock, points.installed({"consumer.before_transaction": pause}):
        job = box.enqueue(task, customer_id=42, period="2026-W33").job_id
        a = box.consumer(ConsumerConfig(lease=timedelta(seconds=30)), name="A")
        thread = threading.Thread(target=lambda: outcome.update(a=a.run_once()), name="worker-A")
        thread.start()
        assert pause.reached.wait(10)
        clock.advance(timedelta(hours=1))  # past the lease (SQLite's outlasts the task timeout)
        rescued = LeaseRescuer(box.store, LeaseRescuerConfig(), box.metrics).run_once()
        assert [(r.id, r.state) for r in rescued.rescued] == [(job, "ready")]
        assert drain(box).completed == 1  # worker B
        pause.release()
        thread.join(10)
        a.session.close()
    assert outcome["a"].lease_lost == 1 and outcome["a"].completed == 0
    assert effects(box) == [(KEY, "attempt-2")]
    row = job_row(box, job)
    assert (row.state, row.outcome, row.attempt) == ("done", "completed", 2)
    attempts = job_attempts(box, job)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "lease_expired")]
    assert "commit refused" in (attempts[0].note or "")
    assert box.metrics.counter("leases_lost") == 1


def test_a_superseded_workers_handler_writes_are_rolled_back(box: Box):
    """A resumes *before* B runs: its handler runs and claims the key, but its fenced settlement
    finds the lease gone, so the intent and the handler's writes roll back; B then completes."""
    task = digest_task(box)
    pause = points.Pause(only=lambda thread: thread == "worker-A", timeout=20)
    outcome: dict[str, ConsumerResult] = {}
    with FrozenClock(box, at=T0) as clock, points.installed({"consumer.before_transaction": pause}):
        job = box.enqueue(task, customer_id=42, period="2026-W33").job_id
        a = box.consumer(ConsumerConfig(lease=timedelta(seconds=30)), name="A")
        thread = threading.Thread(target=lambda: outcome.update(a=a.run_once()), name="worker-A")
        thread.start()
        assert pause.reached.wait(10)
        clock.advance(timedelta(hours=1))  # past the lease (SQLite's outlasts the task timeout)
        LeaseRescuer(box.store, LeaseRescuerConfig(), box.metrics).run_once()
        pause.release()
        thread.join(10)
        a.session.close()
        assert outcome["a"].lease_lost == 1
        assert effects(box) == [] and box.store.intent_count() == 0
        assert drain(box).completed == 1
    assert job_row(box, job).attempt == 2
    assert effects(box) == [(KEY, "attempt-2")]


def test_an_expired_lease_past_the_last_attempt_is_dead_with_its_history(box: Box):
    task = digest_task(box, retry=Retry(max_attempts=1))
    with FrozenClock(box, at=T0) as clock:
        job = box.enqueue(task, customer_id=1, period="2026-W33").job_id
        consumer = box.consumer(ConsumerConfig(lease=timedelta(seconds=30)))
        try:
            leased = consumer.transport.fetch(10)  # leased, then the worker "dies"
        finally:
            consumer.session.close()
        assert len(leased) == 1
        clock.advance(timedelta(hours=1))
        result = LeaseRescuer(box.store, LeaseRescuerConfig(), box.metrics).run_once()
    assert result.dead == 1
    row = job_row(box, job)
    assert row.state == "dead" and "lease expired" in (row.last_error or "")
    assert [a.outcome for a in job_attempts(box, job)] == ["lease_expired"]


def test_a_small_transaction_budget_splits_a_batch_into_transactions(box: Box):
    task = digest_task(box)
    box.enqueue_many(task, [{"customer_id": i, "period": "2026-W33"} for i in range(5)])
    consumer = box.consumer(ConsumerConfig(transaction_budget=timedelta(0)))
    try:
        result = consumer.run_once()
    finally:
        consumer.session.close()
    assert (result.leased, result.completed) == (5, 5)
    assert box.metrics.operations()["consumer_transaction"].calls == 5
    assert len(effects(box)) == 5


def test_a_batch_shares_one_transaction_when_handlers_are_fast(box: Box):
    task = digest_task(box)
    box.enqueue_many(task, [{"customer_id": i, "period": "2026-W33"} for i in range(20)])
    consumer = box.consumer(ConsumerConfig(transaction_budget=timedelta(seconds=60)))
    try:
        assert consumer.run_once().completed == 20
    finally:
        consumer.session.close()
    assert box.metrics.operations()["consumer_transaction"].calls == 1


def test_pruning_done_jobs_never_deletes_intents(box: Box):
    task = digest_task(box)

    @box.task(key="short-lived/{n}", keep_intents=timedelta(days=30))
    def short_lived(ctx, n: int) -> None:
        pass

    with FrozenClock(box, at=T0) as clock:
        box.enqueue_many(task, [{"customer_id": i, "period": "2026-W33"} for i in range(3)])
        box.enqueue(short_lived, n=1)
        drain(box)
        pruner = Pruner.for_runtime(box.runtime, PrunerConfig())  # jobs: 14 days
        assert pruner.run_once().pruned["jobs"] == 0
        # past 14 days from the end of their week (PostgreSQL's history prunes by week)
        clock.advance(timedelta(days=22))
        result = pruner.run_once()
        assert (result.pruned["jobs"], result.pruned["intents"]) == (4, 0)
        assert box.store.job_count_by_state().counts == {}
        assert box.store.intent_count() == 4
        clock.advance(timedelta(days=9))  # past short_lived's explicit intent policy
        assert pruner.run_once().pruned["intents"] == 1
    assert box.store.intent_get("short-lived/1") is None
    assert box.store.intent_count() == 3
    again = box.enqueue(task, customer_id=1, period="2026-W33")
    assert (again.created, again.reason) == (False, "key_claimed")


def test_higher_priority_jobs_run_first(box: Box):
    ran: list[str] = []

    @box.task(key="p/{name}")
    def job(ctx, name: str) -> None:
        ran.append(name)

    box.enqueue(job, name="low-1")
    box.enqueue(job, name="high", priority=10)
    box.enqueue(job, name="low-2")
    box.enqueue(job, name="lowest", priority=-5)
    drain(box)
    assert ran == ["high", "low-1", "low-2", "lowest"]


def test_heartbeats_extend_held_leases_until_a_handler_overruns(box: Box):
    from oncebox.lanes.lease_keeper import LeaseKeeper, LeaseKeeperConfig
    from oncebox.queue.watch import HandlerWatch

    task = digest_task(box)
    with FrozenClock(box, at=T0) as clock:
        job = box.enqueue(task, customer_id=1, period="2026-W33").job_id
        consumer = box.consumer(ConsumerConfig(lease=timedelta(seconds=30)))
        watch = HandlerWatch(exit_on_hang=False)
        try:
            consumer.transport.fetch(10)
            first_deadline = job_row(box, job).lease_expires_at
            assert first_deadline is not None
            keeper = LeaseKeeper(
                box.store,
                LeaseKeeperConfig(timedelta(seconds=30)),
                watch,
                consumer.transport.held_tokens,
            )
            clock.advance(timedelta(seconds=20))
            assert keeper.run_once().extended == 1
            # pushed out to now + 30 s, never earlier than the lease it had (SQLite's is longer)
            expected = max(first_deadline, clock.instant + timedelta(seconds=30))
            assert job_row(box, job).lease_expires_at == expected
            [token] = consumer.transport.held_tokens()
            with watch.running("weekly_digest", KEY, timedelta(0), token):  # past its timeout
                assert keeper.run_once().extended == 0
            with watch.running("other", "other/1", timedelta(0), "another-lease"):
                assert keeper.run_once().extended == 1  # one overrun does not starve the rest
        finally:
            consumer.session.close()
