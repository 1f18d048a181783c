"""The consumer on a RabbitMQ queue, on every store and the machine's real broker: each message's
key is claimed once however often RabbitMQ delivers it — a lost acknowledgement ends as a counted
claim conflict —, a failed attempt waits its rung of the retry ladder and comes back with its
attempt counted, and a dead one reaches the dead letters with its error."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta

import pytest

from oncebox import (
    Box,
    ConfigurationError,
    ConsumerConfig,
    JobContext,
    Permanent,
    Retry,
    RetryLater,
    WorkerConfig,
)
from oncebox.brokers.messages import Message
from oncebox.brokers.rabbitmq.transport import RabbitTransport, task_message
from oncebox.brokers.rabbitmq.wire import RabbitQueue
from oncebox.queue.transport import Delivery, Settlement
from support.brokers import AMQP_URL, reachable
from support.db import create_effects, effects, record_effect
from support.transports import consume_rounds

PERIOD = "2026-W33"


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


def broker_box(url: str) -> Box:
    box = Box(url)
    create_effects(box)

    @box.task(
        key="weekly-digest/customer-{customer_id}/{period}",
        retry=Retry(max_attempts=3, base_delay=timedelta(milliseconds=100)),
    )
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        if customer_id == 99:
            raise Permanent("customer 99 has no address")
        if customer_id == 98 and ctx.attempt == 1:
            raise RetryLater("the carrier's API is busy", delay=timedelta(milliseconds=100))
        record_effect(ctx, f"attempt {ctx.attempt}")

    return box


def transport_for(box: Box, name: str, *, wait_s: float = 1.0) -> RabbitTransport:
    return RabbitTransport(
        RabbitQueue(AMQP_URL, name, prefetch=20, wait_s=wait_s),
        attempts=lambda task: box.registry.get(task).retry.max_attempts,
        now=box.store.clock_now,
    )


def publish(box: Box, transport: RabbitTransport, *customers: int) -> None:
    task = box.registry.get("weekly_digest")
    transport.publish_unrecorded(
        [task_message(task, {"customer_id": c, "period": PERIOD}, 256_000) for c in customers]
    )


def drain_broker(box: Box, transport: RabbitTransport, rounds: int = 20) -> int:
    """Run consumer rounds until one finds nothing; what they leased."""
    return consume_rounds(box, transport, rounds)


def test_each_message_runs_once_and_is_acknowledged(store_url, queue_name):
    box = broker_box(store_url)
    transport = transport_for(box, queue_name)
    try:
        publish(box, transport, *range(10))
        assert drain_broker(box, transport) == 10
        assert [key for key, _ in effects(box)] == sorted(
            f"weekly-digest/customer-{c}/{PERIOD}" for c in range(10)
        )
        transport.close()  # anything not acknowledged would be ready again now
        assert transport.queue.depth() == 0
        assert box.store.counter_list()["jobs_completed"] == 10
    finally:
        transport.close()
        box.close()


class LosesAcks(RabbitTransport):
    """Commits, then dies before acknowledging: its connection closes with the messages unacked."""

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        self.queue.close()


def test_a_lost_acknowledgement_is_delivered_again_and_absorbed_by_the_claim(store_url, queue_name):
    box = broker_box(store_url)
    first = LosesAcks(
        RabbitQueue(AMQP_URL, queue_name, prefetch=20, wait_s=1.0),
        attempts=lambda task: 3,
        now=box.store.clock_now,
    )
    second = transport_for(box, queue_name)
    try:
        publish(box, second, *range(5))
        consumer = box.consumer(ConsumerConfig(batch_size=10), transport=first)
        try:
            assert consumer.run_once().completed == 5  # committed; the acks are lost
        finally:
            consumer.session.close()
        assert drain_broker(box, second) == 5  # RabbitMQ delivers all five again
        counted = box.store.counter_list()
        assert (counted["jobs_completed"], counted["claim_conflicts"]) == (5, 5)
        assert len(effects(box)) == 5  # each key's effect once
        second.close()
        assert second.queue.depth() == 0
    finally:
        second.close()
        box.close()


def test_a_failed_attempt_waits_its_rung_and_a_dead_one_reaches_the_dead_letters(
    store_url, queue_name
):
    box = broker_box(store_url)
    transport = transport_for(box, queue_name)
    try:
        publish(box, transport, 98, 99)
        leased = 0
        for _ in range(20):  # the retry comes back after its 250 ms rung
            leased += drain_broker(box, transport)
            if leased >= 3:
                break
        assert leased == 3  # 98 twice (a retry), 99 once (dead at once)
        assert effects(box) == [(f"weekly-digest/customer-98/{PERIOD}", "attempt 2")]
        transport.close()
        assert (transport.queue.depth(), transport.queue.depth("dead")) == (0, 1)
        dead = RabbitQueue(AMQP_URL, f"{queue_name}.dead", wait_s=2.0)
        try:
            [letter] = dead.receive(1)
            assert json.loads(letter.message.body)["args"]["customer_id"] == 99
            assert "customer 99 has no address" in letter.message.headers["x-oncebox-error"]
            dead.ack([letter])
        finally:
            dead.close()
        counted = box.store.counter_list()
        assert (counted["jobs_retried"], counted["jobs_dead"], counted["jobs_completed"]) == (
            1,
            1,
            1,
        )
    finally:
        transport.close()
        box.close()


def test_a_message_that_is_not_ours_goes_to_the_dead_letters_and_the_rest_run(
    sqlite_url, queue_name
):
    box = broker_box(sqlite_url)
    transport = transport_for(box, queue_name)
    try:
        transport.publish_unrecorded([Message(b"not json", "stray", {})])
        publish(box, transport, 1)
        assert drain_broker(box, transport) == 1
        transport.close()
        assert (transport.queue.depth(), transport.queue.depth("dead")) == (0, 1)
        assert len(effects(box)) == 1
    finally:
        transport.close()
        box.close()


def test_a_delivery_given_back_with_a_delay_waits_on_the_ladder_its_attempt_unspent(
    sqlite_url, queue_name
):
    box = broker_box(sqlite_url)
    transport = transport_for(box, queue_name, wait_s=0.5)
    try:
        publish(box, transport, 1)
        [delivery] = transport.fetch(10)
        transport.release([delivery], timedelta(milliseconds=100))
        again: list[Delivery] = []
        for _ in range(10):
            again = transport.fetch(10)
            if again:
                break
        assert [(d.task, d.attempt) for d in again] == [("weekly_digest", 1)]
        transport.drop(again)  # back to the queue at once, for whoever takes it next
        assert drain_broker(box, transport) == 1
    finally:
        transport.close()
        box.close()


def test_a_worker_consumes_a_queue_its_box_says_a_broker_holds(store_url, queue_name):
    """`box.queue(name, broker=...)`: the worker's lanes for that queue read RabbitMQ; the
    table queue's lanes serve the rest."""
    box = broker_box(store_url)  # weekly_digest: on the default queue, the table's

    @box.task(key="event/{n}", queue=queue_name)
    def event(ctx: JobContext, n: int) -> None:
        record_effect(ctx, "from the broker")

    box.queue(queue_name, broker=AMQP_URL)
    try:
        for n in range(4):
            box.publish_unrecorded(event, n=n)
        box.enqueue("weekly_digest", customer_id=1, period=PERIOD)  # the table queue's
        result = box.work(config=WorkerConfig(until_idle=True, concurrency=2))
        assert result.consumed.completed == 5, result
        assert (
            sorted(note for _key, note in effects(box)) == ["attempt 1"] + ["from the broker"] * 4
        )
        probe = RabbitQueue(AMQP_URL, queue_name)
        try:
            assert probe.depth() == 0
        finally:
            probe.close()
    finally:
        box.close()


def test_publishing_unrecorded_needs_a_queue_a_broker_holds(sqlite_url):
    box = broker_box(sqlite_url)
    try:
        with pytest.raises(ConfigurationError, match="its queue 'default' has no broker"):
            box.publish_unrecorded("weekly_digest", customer_id=1, period=PERIOD)
        with pytest.raises(ConfigurationError, match=r"a broker is a RabbitMQ URL \(amqp:"):
            box.queue("events", broker="redis://127.0.0.1")
    finally:
        box.close()


def test_an_ordered_task_on_a_broker_held_queue_is_refused_with_why(sqlite_url):
    box = broker_box(sqlite_url)

    @box.task(key="leg/{shipment}/{n}", queue="legs", group_by="shipment")
    def leg(ctx: JobContext, shipment: int, n: int) -> None:
        pass

    box.queue("legs", broker=AMQP_URL)
    try:
        with pytest.raises(ConfigurationError, match="its jobs would reach the broker in no order"):
            box.publish_unrecorded(leg, shipment=1, n=1)
        with pytest.raises(ConfigurationError, match="task 'leg' is ordered by 'shipment'"):
            box.work(config=WorkerConfig(until_idle=True))
    finally:
        box.close()
