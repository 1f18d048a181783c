"""Jobs of a queue RabbitMQ holds keep their record in the store (PostgreSQL, migration 0016): an
enqueue writes the job `relayed` with the caller's transaction, the relay (the outbox channel
`~broker.<queue>`) publishes each attempt with the broker's confirms, and the consumer settles
the row fenced on the attempt it was delivered — so a lost acknowledgement, a duplicate publish,
a cancel or a replay reads the same as on the table queue. The machine's real broker; never a
mock."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from oncebox import (
    Box,
    ConfigurationError,
    EnqueueResult,
    JobContext,
    Permanent,
    Retry,
)
from oncebox.brokers.brokered import RELAY_PREFIX
from oncebox.brokers.messages import Message
from oncebox.brokers.rabbitmq.transport import RabbitTransport
from oncebox.brokers.rabbitmq.wire import RabbitQueue
from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.queue.transport import Settlement
from oncebox.testing import FrozenClock
from support.brokers import AMQP_URL, reachable
from support.db import create_effects, effects, record_effect, sql
from support.transports import consume_rounds
from support.waiting import wait_until

PERIOD = "2026-W49"
T0 = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)


@pytest.fixture
def queue_name() -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex[:10]}"
    setup = RabbitQueue(reachable(AMQP_URL), name)
    setup.declare()
    try:
        yield name
    finally:
        setup.delete()
        setup.close()


def relay_box(url: str, queue: str) -> Box:
    box = Box(url, secret="relay-tests-secret-0123456789")
    create_effects(box)

    @box.task(
        key="weekly-digest/customer-{customer_id}/{period}",
        queue=queue,
        retry=Retry(max_attempts=3, base_delay=timedelta(seconds=30)),
    )
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        if customer_id == 99:
            raise Permanent("customer 99 has no address")
        if customer_id == 98 and ctx.attempt == 1:
            raise RuntimeError("the carrier's API is busy")
        record_effect(ctx, f"attempt {ctx.attempt}")

    box.queue(queue, broker=AMQP_URL)
    return box


def transport_for(
    box: Box, queue: str, cls: type[RabbitTransport] = RabbitTransport, prefetch: int = 20
) -> Any:
    return cls(
        RabbitQueue(AMQP_URL, queue, prefetch=prefetch, wait_s=0.5),
        attempts=lambda task: box.registry.get(task).retry.max_attempts,
        now=box.store.clock_now,
        store=box.store,
        worker="test-worker",
    )


def relay(box: Box) -> int:
    """One pass of the relay: the dispatcher publishes what is due; how many it published."""
    return box.dispatcher().run_once().sent


def consume(box: Box, transport: RabbitTransport, rounds: int = 10) -> int:
    """Consumer rounds until one finds nothing; what they ran."""
    return consume_rounds(box, transport, rounds)


def job_id_of(result: EnqueueResult) -> int:
    assert result.job_id is not None
    return result.job_id


def state_of(box: Box, job_id: int) -> str:
    job = box.store.job_get(job_id)
    assert job is not None
    return job.state


def key_of(customer: int) -> str:
    return f"weekly-digest/customer-{customer}/{PERIOD}"


def test_an_enqueue_in_the_callers_transaction_is_published_only_once_it_commits(
    pg_url, queue_name
):
    box = relay_box(pg_url, queue_name)
    transport = transport_for(box, queue_name)
    try:
        with psycopg.connect(pg_url) as conn:
            box.enqueue("weekly_digest", connection=conn, customer_id=1, period=PERIOD)
            conn.rollback()
        assert box.find(key_of(1)) == []
        assert relay(box) == 0

        with psycopg.connect(pg_url) as conn:
            result = box.enqueue("weekly_digest", connection=conn, customer_id=1, period=PERIOD)
            assert (result.created, result.state) == (True, "relayed")
            assert relay(box) == 0  # not committed yet: nothing to publish
            conn.commit()
        [publish] = box.store.outbox_find_by_key(f"~relay/{result.job_id}/1")
        assert (publish.channel, publish.state) == (f"{RELAY_PREFIX}{queue_name}", "pending")
        assert relay(box) == 1
        assert transport.queue.depth() == 1
        assert consume(box, transport) == 1
        [job] = box.find(key_of(1))
        assert (job.state, job.outcome, job.attempt) == ("done", "completed", 1)
        assert effects(box) == [(key_of(1), "attempt 1")]
        transport.close()
        assert transport.queue.depth() == 0
    finally:
        transport.close()
        box.close()


class LosesAcks(RabbitTransport):
    """Commits, then dies before acknowledging: its connection closes with the messages unacked."""

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        self.queue.close()


def test_a_lost_acknowledgement_is_acknowledged_unrun_and_counted_as_a_claim_conflict(
    pg_url, queue_name
):
    box = relay_box(pg_url, queue_name)
    first = transport_for(box, queue_name, LosesAcks)
    second = transport_for(box, queue_name)
    try:
        for customer in range(5):
            box.enqueue("weekly_digest", customer_id=customer, period=PERIOD)
        assert relay(box) == 5
        assert consume(box, first, rounds=1) == 5  # committed; the acks are lost
        ran: list[int] = []

        def every_copy_came_back() -> bool:
            # RabbitMQ returns the closed connection's messages in its own time: a round may
            # find some of them only, and the next the rest
            ran.append(consume(box, second, rounds=1))
            return box.store.counter_list().get("claim_conflicts", 0) >= 5

        wait_until(every_copy_came_back, what="the five copies the lost acknowledgements left")
        assert sum(ran) == 0  # none of them ran
        counted = box.store.counter_list()
        assert (counted["jobs_completed"], counted["claim_conflicts"]) == (5, 5)
        assert len(effects(box)) == 5
        second.close()
        assert second.queue.depth() == 0
    finally:
        first.close()
        second.close()
        box.close()


def test_a_duplicate_publish_runs_once_even_when_both_copies_run_at_once(pg_url, queue_name):
    """The relay's confirm lost, its publish sent again: two copies. Taken by two consumers at
    the same moment, both pass the check before running; the claim makes the second a
    duplicate, and the attempt fence rolls its settlement back."""
    box = relay_box(pg_url, queue_name)
    publisher = RabbitQueue(AMQP_URL, queue_name)
    lanes = [transport_for(box, queue_name) for _ in range(2)]
    try:
        job_id = job_id_of(box.enqueue("weekly_digest", customer_id=7, period=PERIOD))
        [row] = box.store.outbox_find_by_key(f"~relay/{job_id}/1")
        body = row.payload_json.encode()
        publisher.publish([Message(body, row.token), Message(body, row.token)])
        barrier = threading.Barrier(2)
        ran: list[int] = []

        class Together(RabbitTransport):
            def fetch(self, limit: int) -> list[Any]:
                got = super().fetch(1)
                if got:
                    barrier.wait(timeout=30)  # both hold a current copy before either runs
                return got

        # one message per consumer: each lane's prefetch holds one copy
        lanes = [transport_for(box, queue_name, Together, prefetch=1) for _ in range(2)]
        threads = [
            threading.Thread(target=lambda t=t: ran.append(consume(box, t, rounds=1)))
            for t in lanes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert ran == [1, 1]  # both copies were current when taken
        assert effects(box) == [(key_of(7), "attempt 1")]
        for lane in lanes:
            lane.close()  # a copy given back after the rolled-back settlement is delivered again
        lanes.append(transport_for(box, queue_name))
        assert consume(box, lanes[-1]) == 0
        [job] = box.find(key_of(7))
        assert (job.state, job.outcome) == ("done", "completed")
        assert publisher.depth() == 0
    finally:
        publisher.close()
        for lane in lanes:
            lane.close()
        box.close()


def test_a_failed_attempt_is_published_again_when_due_and_a_dead_job_is_replayed_through_the_relay(
    pg_url, queue_name
):
    box = relay_box(pg_url, queue_name)
    transport = transport_for(box, queue_name)
    try:
        with FrozenClock(box, at=T0) as clock:
            retried = job_id_of(box.enqueue("weekly_digest", customer_id=98, period=PERIOD))
            dead = job_id_of(box.enqueue("weekly_digest", customer_id=99, period=PERIOD))
            assert relay(box) == 2
            assert consume(box, transport) == 2
            job = box.store.job_get(retried)
            assert job is not None
            assert (job.state, job.attempt) == ("relayed", 1)
            assert T0 < job.run_at <= T0 + timedelta(seconds=30)  # its backoff, jittered
            [second] = box.store.outbox_find_by_key(f"~relay/{retried}/2")
            assert (second.state, second.next_attempt_at) == ("pending", job.run_at)
            assert [a.outcome for a in box.store.job_attempt_list(retried)] == ["failed"]
            assert relay(box) == 0  # the second attempt's publish is not due yet
            clock.advance(timedelta(seconds=31))
            assert relay(box) == 1
            assert consume(box, transport) == 1
            assert state_of(box, retried) == "done"
            assert effects(box) == [(key_of(98), "attempt 2")]

            assert state_of(box, dead) == "dead"
            box.replay(dead, reason="address fixed")
            assert state_of(box, dead) == "ready"
            adopt = LeaseRescuer(
                box.store,
                LeaseRescuerConfig(),
                box.metrics,
                brokered={queue_name: ["weekly_digest"]},
            )
            adopt.run_once()
            assert state_of(box, dead) == "relayed"
            assert relay(box) == 1
            assert consume(box, transport) == 1
            replayed = box.store.job_get(dead)
            assert replayed is not None and (replayed.state, replayed.attempt) == ("dead", 2)
    finally:
        transport.close()
        box.close()


def test_a_cancelled_relayed_job_is_acknowledged_unrun(pg_url, queue_name):
    box = relay_box(pg_url, queue_name)
    transport = transport_for(box, queue_name)
    try:
        box.enqueue("weekly_digest", customer_id=3, period=PERIOD)
        assert relay(box) == 1
        box.cancel(key_of(3), reason="customer left")
        assert consume(box, transport) == 0
        assert effects(box) == []
        assert box.store.counter_list()["deliveries_stale"] == 1
        transport.close()
        assert transport.queue.depth() == 0
    finally:
        transport.close()
        box.close()


def test_a_worker_runs_relayed_jobs_from_enqueue_to_done_and_the_counts_read_them(
    pg_url, queue_name
):
    from oncebox import WorkerConfig

    box = relay_box(pg_url, queue_name)
    try:
        box.enqueue_many("weekly_digest", [{"customer_id": c, "period": PERIOD} for c in range(20)])
        waiting = box.store.job_count_by_state()
        assert waiting["relayed"] == 20
        result = box.work(config=WorkerConfig(until_idle=True, concurrency=2))
        assert result.consumed.completed == 20, result
        assert len(effects(box)) == 20
        assert box.store.job_count_by_state()["done"] == 20
    finally:
        box.close()


def test_sqlite_refuses_a_recorded_job_on_a_broker_held_queue_and_limits_are_refused(sqlite_url):
    box = relay_box(sqlite_url, "events")

    @box.task(key="pace/{n}", queue="events", limits=[oncebox_concurrency()])
    def paced(ctx: JobContext, n: int) -> None:
        pass

    try:
        with pytest.raises(ConfigurationError, match="keeps its jobs' records on PostgreSQL"):
            box.enqueue("weekly_digest", customer_id=1, period=PERIOD)
        with pytest.raises(ConfigurationError, match="task 'paced' has limits"):
            box.enqueue(paced, n=1)
        assert box.find(key_of(1)) == []
    finally:
        box.close()


def oncebox_concurrency() -> Any:
    from oncebox import Concurrency

    return Concurrency(2)


def test_a_groups_jobs_reach_the_broker_one_at_a_time_and_run_in_order_across_consumers(
    pg_url, queue_name
):
    """The relay publishes a group's next job only when the one before it ended (done, dead or
    cancelled), so two lanes taking from the broker at once keep each shipment's legs in order
    while shipments run side by side."""
    box = relay_box(pg_url, queue_name)
    sql(box, "CREATE TABLE run_order (seq bigserial PRIMARY KEY, leg text)")

    @box.task(key="leg/{shipment}/{n}", queue=queue_name, group_by="shipment")
    def leg(ctx: JobContext, shipment: int, n: int) -> None:
        if (shipment, n) == (2, 1):
            raise Permanent("the depot refused leg 1")
        record_effect(ctx, f"{shipment}/{n}")
        ctx.connection.execute("INSERT INTO run_order (leg) VALUES (%s)", (f"{shipment}/{n}",))

    lanes = [transport_for(box, queue_name) for _ in range(2)]
    try:
        box.enqueue_many(leg, [{"shipment": s, "n": n} for s in (1, 2) for n in range(4)])
        published = relay(box)
        assert published == 2  # each shipment's first leg; the rest wait their turn
        ran = 0
        for _ in range(20):  # relay, then both lanes take what the broker holds
            got = sum(consume(box, lane, rounds=1) for lane in lanes)
            ran += got
            if not relay(box) and not got:
                break
        order = [row[0] for row in sql(box, "SELECT leg FROM run_order ORDER BY seq")]
        assert sorted(order) == ["1/0", "1/1", "1/2", "1/3", "2/0", "2/2", "2/3"]
        for shipment in ("1", "2"):
            mine = [n for n in order if n.startswith(shipment + "/")]
            assert mine == sorted(mine)  # each shipment's legs in the order enqueued
        assert ran == 8
        counts = box.store.job_count_by_state()
        assert (counts["done"], counts["dead"]) == (7, 1)
    finally:
        for lane in lanes:
            lane.close()
        box.close()
