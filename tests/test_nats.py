"""A queue NATS JetStream holds, on the machine's NATS server: the wire — a work-queue stream and
a durable pull consumer, publishes the stream acknowledges (a second copy within the duplicate
window dropped), fetches under `ack_wait`, acknowledgements, negative ones, in-progress ones,
dead letters — and jobs recorded on PostgreSQL, relayed to JetStream and settled once however
often it delivers them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from oncebox import Box, JobContext
from oncebox.brokers.messages import Message
from oncebox.brokers.nats.wire import NatsQueue
from oncebox.brokers.transport import BrokerTransport
from support.brokers import NATS_URL, reachable
from support.db import create_effects, effects, record_effect
from support.transports import consume_rounds

PERIOD = "2026-W49"


@pytest.fixture
def wire() -> Iterator[NatsQueue]:
    queue = NatsQueue(f"{reachable(NATS_URL)}?ack_wait=30", f"test-{uuid.uuid4().hex[:8]}")
    queue.declare()
    try:
        yield queue
    finally:
        queue.delete()
        queue.close()


def message(n: int, message_id: str | None = None) -> Message:
    return Message(f'{{"n": {n}}}'.encode(), message_id or f"m-{n}", {"x-oncebox-channel": "c"})


def test_a_publish_is_fetched_acknowledged_and_gone_and_a_copy_in_the_window_dropped(wire):
    assert wire.publish_batch([message(n) for n in range(5)]) == set()
    wire.publish([message(0)])  # the same Nats-Msg-Id within the duplicate window
    assert wire.depth() == 5
    got = wire.receive(10)
    assert sorted(r.message.message_id for r in got) == [f"m-{n}" for n in range(5)]
    assert {r.message.headers["x-oncebox-channel"] for r in got} == {"c"}
    wire.ack(got)
    assert wire.receive(10) == [] and wire.depth() == 0 and wire.in_flight() == 0


def test_a_message_given_back_is_delivered_again_with_its_delivery_count(wire):
    wire.publish([message(1)])
    [first] = wire.receive(1)
    assert first.message.headers["x-oncebox-attempt"] == "1" and not first.redelivered
    wire.give_back([first])
    [again] = wire.receive(1)
    assert again.redelivered and again.message.headers["x-oncebox-attempt"] == "2"
    wire.extend([again], 30)  # still held: in progress
    assert wire.in_flight() == 1
    wire.dead(again, {"x-oncebox-error": "no address"})
    assert wire.depth() == 0 and wire.depth("dead") == 1 and wire.in_flight() == 0


def nats_box(pg_url: str, broker: str, queue: str) -> Box:
    box = Box(pg_url, secret="nats-tests-secret-0123456789")
    create_effects(box)

    @box.task(key="weekly-digest/customer-{customer_id}/{period}", queue=queue)
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        record_effect(ctx, f"attempt {ctx.attempt}")

    box.queue(queue, broker=broker)
    return box


def test_relayed_jobs_reach_jetstream_after_the_commit_and_run_once(pg_url: str):
    queue = f"digests-{uuid.uuid4().hex[:8]}"
    broker = reachable(NATS_URL)
    box = nats_box(pg_url, broker, queue)
    wire: Any = NatsQueue(broker, queue, wait_s=0.5)
    wire.declare()
    consumer = BrokerTransport(
        wire,
        attempts=lambda task: box.registry.get(task).retry.max_attempts,
        now=box.store.clock_now,
        store=box.store,
        worker="nats-test",
    )
    try:
        ids = [
            box.enqueue("weekly_digest", customer_id=customer, period=PERIOD).job_id
            for customer in range(5)
        ]
        assert box.dispatcher().run_once().sent == 5
        assert consume_rounds(box, consumer) == 5
        assert len(effects(box)) == 5
        # a copy published again past the stream's window (another id) is acknowledged unrun
        [publish] = box.store.outbox_find_by_key(f"~relay/{ids[0]}/1")
        wire.publish([Message(publish.payload_json.encode(), "again")])
        assert consume_rounds(box, consumer) == 0
        counted = box.store.counter_list()
        assert (counted["jobs_completed"], counted["claim_conflicts"]) == (5, 1)
        assert wire.depth() == 0 and wire.in_flight() == 0
    finally:
        consumer.close()
        wire.delete()
        wire.close()
        box.close()
