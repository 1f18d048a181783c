"""A queue Amazon SQS holds, on an SQS-compatible server the tests start (moto's): the wire —
batched sends that answer per message, receives under a visibility timeout, deletes, give-backs,
extensions, dead letters, the size cap said before sending — and jobs recorded on PostgreSQL,
relayed to SQS (standard and FIFO) and settled once however often SQS delivers them."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from oncebox import Box, InvalidArguments, JobContext
from oncebox.brokers.messages import Message, Received
from oncebox.brokers.sqs.wire import MAX_MESSAGE_BYTES, SqsQueue
from oncebox.brokers.transport import BrokerTransport
from oncebox.kernel.errors import BrokerRefused
from support.brokers import sqs_url
from support.db import create_effects, effects, record_effect
from support.transports import consume_rounds

PERIOD = "2026-W49"


@pytest.fixture(params=[False, True], ids=["standard", "fifo"])
def wire(request: pytest.FixtureRequest, sqs_endpoint: str) -> Iterator[SqsQueue]:
    queue = SqsQueue(
        sqs_url(sqs_endpoint, fifo=request.param, visibility=30),
        f"test-{uuid.uuid4().hex[:8]}",
        wait_s=1,
    )
    queue.declare()
    try:
        yield queue
    finally:
        queue.delete()
        queue.close()


def message(n: int) -> Message:
    return Message(f'{{"n": {n}}}'.encode(), f"m-{n}", {"x-oncebox-channel": "c"})


def test_a_batch_is_sent_in_tens_received_deleted_and_gone(wire: SqsQueue):
    assert wire.publish_batch([message(n) for n in range(25)]) == set()
    got = wire.receive(25)
    assert sorted(r.message.message_id for r in got) == sorted(f"m-{n}" for n in range(25))
    assert {r.message.headers["x-oncebox-channel"] for r in got} == {"c"}
    wire.ack(got)
    assert wire.receive(25) == [] and wire.depth() == 0


def test_a_message_given_back_is_received_again_with_its_receive_count(wire: SqsQueue):
    wire.publish([message(1)])
    [first] = wire.receive(1)
    assert first.message.headers["x-oncebox-attempt"] == "1" and not first.redelivered
    wire.give_back([first])
    [again] = wire.receive(1)
    assert again.message.message_id == "m-1" and again.redelivered
    assert again.message.headers["x-oncebox-attempt"] == "2"
    wire.dead(again, {"x-oncebox-error": "no address"})
    assert wire.depth() == 0 and wire.depth("dead") == 1


def test_a_held_message_extended_is_not_received_by_another_consumer(wire: SqsQueue):
    wire.publish([message(2)])
    [held] = wire.receive(1)
    wire.extend([held], 120)
    other = SqsQueue(wire.url, wire.name.removeprefix("oncebox-").removesuffix(".fifo"))
    try:
        assert other.receive(1) == []
    finally:
        other.close()
    wire.ack([held])


def test_large_messages_are_sent_in_batches_sqs_takes(wire: SqsQueue):
    """Ten messages of 400 KB are 4 MB: one batch call SQS would refuse whole (1 MiB a call)."""
    big = [Message(b"x" * 400_000, f"m-big-{n}") for n in range(10)]
    assert wire.publish_batch(big) == set()
    got: list[Received] = []
    while len(got) < 10 and (more := wire.receive(10)):
        got += more
    assert sorted(r.message.message_id for r in got) == sorted(m.message_id for m in big)
    wire.ack(got)


def test_a_message_over_sqs_s_cap_is_refused_before_it_is_sent(wire: SqsQueue):
    big = Message(b"x" * MAX_MESSAGE_BYTES, "m-big")
    with pytest.raises(BrokerRefused, match=r"exceeds SQS's 1048576"):
        wire.publish([big])
    assert wire.depth() == 0


def sqs_box(pg_url: str, broker: str, queue: str) -> Box:
    box = Box(pg_url, secret="sqs-tests-secret-0123456789", max_payload_bytes=4 * 1_048_576)
    create_effects(box)

    @box.task(key="weekly-digest/customer-{customer_id}/{period}", queue=queue)
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        record_effect(ctx, f"attempt {ctx.attempt}")

    @box.task(key="blob/{n}", queue=queue)
    def blob(ctx: JobContext, n: int, data: str) -> None:
        pass

    box.queue(queue, broker=broker)
    return box


def lane(box: Box, broker: str, queue: str) -> BrokerTransport:
    wire = SqsQueue(broker, queue, prefetch=20, wait_s=1)
    wire.declare()
    return BrokerTransport(
        wire,
        attempts=lambda task: box.registry.get(task).retry.max_attempts,
        now=box.store.clock_now,
        store=box.store,
        worker="sqs-test",
    )


@pytest.mark.parametrize("fifo", [False, True], ids=["standard", "fifo"])
def test_relayed_jobs_reach_sqs_after_the_commit_and_run_once(
    pg_url: str, sqs_endpoint: str, fifo: bool
):
    queue = f"digests-{uuid.uuid4().hex[:8]}"
    broker = sqs_url(sqs_endpoint, fifo=fifo)
    box = sqs_box(pg_url, broker, queue)
    consumer = lane(box, broker, queue)
    wire: Any = consumer.queue  # the SqsQueue under the transport
    try:
        with psycopg.connect(pg_url) as conn:
            box.enqueue("weekly_digest", connection=conn, customer_id=1, period=PERIOD)
            conn.rollback()
        ids = [
            box.enqueue("weekly_digest", customer_id=customer, period=PERIOD).job_id
            for customer in range(5)
        ]
        assert box.dispatcher().run_once().sent == 5
        assert consume_rounds(box, consumer) == 5
        assert len(effects(box)) == 5
        assert box.store.job_count_by_state()["done"] == 5
        # a copy sent again (a relay whose answer was lost) is received and acknowledged unrun
        [publish] = box.store.outbox_find_by_key(f"~relay/{ids[0]}/1")
        wire.publish([Message(publish.payload_json.encode(), "again")])
        assert consume_rounds(box, consumer) == 0
        counted = box.store.counter_list()
        assert (counted["jobs_completed"], counted["claim_conflicts"]) == (5, 1)
        assert wire.depth() == 0
    finally:
        consumer.close()
        wire.delete()
        box.close()


def test_an_enqueue_too_large_for_sqs_is_refused_before_it_is_written(
    pg_url: str, sqs_endpoint: str
):
    queue = f"blobs-{uuid.uuid4().hex[:8]}"
    box = sqs_box(pg_url, sqs_url(sqs_endpoint), queue)
    try:
        with pytest.raises(InvalidArguments, match="exceed the 1048576 bytes SQS takes"):
            box.enqueue("blob", n=1, data="x" * 1_048_000)
        assert box.find("blob/1") == []
    finally:
        box.close()


@pytest.mark.parametrize("fifo", [True], ids=["fifo"])
def test_a_fifo_copy_sent_within_five_minutes_is_dropped_even_after_the_first_was_deleted(
    sqs_endpoint: str, fifo: bool
):
    """AWS remembers a deduplication id for five minutes whether or not its message is still in
    the queue; the tests' server is made to (`oncebox.fakes.sqs`), or the dedupe benchmark would
    understate what FIFO removes."""
    wire = SqsQueue(sqs_url(sqs_endpoint, fifo=fifo), f"test-{uuid.uuid4().hex[:8]}", wait_s=1)
    wire.declare()
    try:
        wire.publish([message(1)])
        [first] = wire.receive(1)
        wire.ack([first])
        wire.publish([message(1)])  # the same oncebox id: the same deduplication id
        wire.publish([message(2)])
        assert [r.message.message_id for r in wire.receive(10)] == ["m-2"]
    finally:
        wire.delete()
        wire.close()


def test_a_fifo_relay_puts_a_groups_jobs_in_one_message_group(pg_url: str, sqs_endpoint: str):
    """The relay's publish names its job's group, so SQS FIFO serialises the group's messages
    too (under a digest: a `group_by` value need not be what MessageGroupId takes); a job
    without a group — or a publish written before publishes named theirs — is a group of its
    own, its token."""
    queue = f"legs-{uuid.uuid4().hex[:8]}"
    broker = sqs_url(sqs_endpoint, fifo=True)
    box = sqs_box(pg_url, broker, queue)

    @box.task(key="leg/{n}", queue=queue, group_by="shipment")
    def leg(ctx: JobContext, shipment: str, n: int) -> None:
        pass

    wire = SqsQueue(broker, queue, wait_s=1)
    wire.declare()
    try:
        shipment = "Zürich → Genève #7"
        box.enqueue("leg", shipment=shipment, n=0)
        loner = box.enqueue("weekly_digest", customer_id=1, period=PERIOD).job_id
        assert box.dispatcher().run_once().sent == 2
        answer = wire._sqs().receive_message(
            QueueUrl=wire._url(wire.name),
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            AttributeNames=["MessageGroupId"],
        )
        sent = {
            json.loads(m["Body"])["task"]: (json.loads(m["Body"]), m["Attributes"])
            for m in answer.get("Messages", [])
        }
        body, attributes = sent["leg"]
        assert body["group"] == shipment
        assert attributes["MessageGroupId"] == hashlib.sha256(shipment.encode()).hexdigest()
        body, attributes = sent["weekly_digest"]
        assert "group" not in body and attributes["MessageGroupId"] == f"relay-{loner}-1"
    finally:
        wire.delete()
        wire.close()
        box.close()
