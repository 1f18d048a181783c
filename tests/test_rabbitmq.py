"""RabbitMQ's side of a broker-backed queue, on the machine's real server: confirmed publishes,
manual acknowledgements, redelivery after a lost acknowledgement, delayed retry through the TTL
ladder, dead letters with their headers. Each test declares queues of its own and deletes them."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import pytest

from oncebox import Box, ConfigurationError, JobContext
from oncebox.brokers.messages import Message, Received
from oncebox.brokers.rabbitmq.wire import RETRY_LADDER_MS, RabbitQueue, retry_delay_ms
from oncebox.chaos.mutations import mutated
from oncebox.kernel.errors import BrokerRefused, BrokerUnavailable
from oncebox.testing import drain
from support.brokers import AMQP_URL, reachable
from support.db import sql


@pytest.fixture
def queue() -> Iterator[RabbitQueue]:
    name = f"test-{uuid.uuid4().hex[:10]}"
    opened = RabbitQueue(reachable(AMQP_URL), name, prefetch=10, wait_s=0.5)
    opened.declare()
    try:
        yield opened
    finally:
        opened.delete()
        opened.close()


SECRET = "rabbitmq-test-secret-0123456789"


def receive_all(queue: RabbitQueue, count: int, tries: int = 10) -> list[Received]:
    """What `count` messages the queue hands over, however the prefetch splits them."""
    found: list[Received] = []
    for _ in range(tries):
        found += queue.receive(count - len(found))
        if len(found) >= count:
            break
    return found


def unacked_return(queue: RabbitQueue) -> None:
    """Close the consumer: whatever it had not acknowledged is ready again (and counted)."""
    queue.close()


def message(n: int, **headers: object) -> Message:
    return Message(f'{{"n": {n}}}'.encode(), f"job-{n}", headers)


def test_a_confirmed_publish_is_received_and_gone_once_acknowledged(queue):
    queue.publish([message(1, key="k/1"), message(2)])
    received = receive_all(queue, 2)
    assert [(r.message.message_id, r.message.headers) for r in received] == [
        ("job-1", {"key": "k/1"}),
        ("job-2", {}),
    ]
    assert not any(r.redelivered for r in received)
    queue.ack(received)
    assert queue.receive(10) == []
    unacked_return(queue)
    assert queue.depth() == 0  # acknowledged: nothing came back when the consumer closed


def test_a_message_whose_ack_was_lost_is_redelivered_to_the_next_consumer(queue):
    queue.publish([message(1)])
    [first] = queue.receive(10)
    queue.close()  # the consumer dies after its commit, before its ack reaches the broker
    again = RabbitQueue(queue.url, queue.name.removeprefix("oncebox."), wait_s=2.0)
    try:
        [second] = again.receive(10)
        assert (second.message.message_id, second.redelivered) == ("job-1", True)
        again.ack([second])
    finally:
        again.close()
    assert (first.message.body, first.message.message_id) == (
        second.message.body,
        second.message.message_id,
    )
    assert second.redelivered


def test_a_retry_waits_its_rung_of_the_ladder_and_comes_back_with_its_headers(queue):
    queue.publish([message(1, attempt=1)])
    [got] = queue.receive(10)
    waited = queue.retry(got, delay_ms=100, headers={"attempt": 2})
    assert waited == RETRY_LADDER_MS[0]
    again: list[Received] = []
    for _ in range(10):  # receive waits up to 0.5 s each: the rung is 0.25 s
        again = queue.receive(10)
        if again:
            break
    assert [(r.message.message_id, r.message.headers["attempt"]) for r in again] == [("job-1", 2)]
    queue.ack(again)


def test_a_dead_letter_keeps_its_key_and_attempt_history(queue):
    queue.publish([message(1, key="k/1")])
    [got] = queue.receive(10)
    history = ["1: ValueError: boom", "2: ValueError: boom"]
    queue.dead(got, {"attempts": history})
    unacked_return(queue)
    assert (queue.depth(), queue.depth("dead")) == (0, 1)  # moved, the original acknowledged
    dead = RabbitQueue(queue.url, queue.name.removeprefix("oncebox.") + ".dead", wait_s=2.0)
    try:
        [letter] = dead.receive(10)
        assert letter.message.headers == {"key": "k/1", "attempts": history}
        dead.ack([letter])
    finally:
        dead.close()


def test_a_publish_the_broker_cannot_route_raises_and_an_unreachable_broker_says_where(queue):
    with pytest.raises(BrokerRefused, match=r"could not route a message to 'oncebox\.nowhere'"):
        queue.publish([message(1)], to="oncebox.nowhere")
    gone = RabbitQueue("amqp://guest:guest@127.0.0.1:1/%2F", "x")
    with pytest.raises(BrokerUnavailable, match=r"RabbitMQ at amqp://127\.0\.0\.1:1/"):
        gone.declare()


def test_a_queue_declared_with_another_delivery_limit_is_used_as_it_is_saying_so(queue, caplog):
    """RabbitMQ keeps a queue's arguments from its first declare: a changed `max_deliveries`
    cannot be applied. The queue is used as it is — refusing it would stop a deploy's new
    workers beside the old — and a warning says what to do to apply it."""
    name = queue.name.removeprefix("oncebox.")
    other = RabbitQueue(f"{queue.url}?max_deliveries=3", name)
    try:
        with caplog.at_level("WARNING", logger="oncebox.rabbitmq"):
            other.declare()
        other.publish([message(1)])
        assert [r.message.message_id for r in receive_all(other, 1)] == ["job-1"]
    finally:
        other.close()
    [warning] = [r.getMessage() for r in caplog.records if r.name == "oncebox.rabbitmq"]
    assert "declared by an earlier oncebox or with another max_deliveries" in warning
    assert "max_deliveries=3" in warning and "delete the queue once it is drained" in warning
    with pytest.raises(ConfigurationError, match="max_deliveries is a number, at least 1"):
        RabbitQueue(f"{queue.url}?max_deliveries=0", name)


def test_a_queue_an_earlier_oncebox_declared_keeps_working_beside_the_new_release():
    """A rolling deploy: the main queue as the release before this one declared it (dead
    letters straight to `.dead`, no delivery limit) is used as it is by the new workers."""
    import pika

    name = f"test-{uuid.uuid4().hex[:10]}"
    url = reachable(AMQP_URL)
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        connection.channel().queue_declare(
            f"oncebox.{name}",
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": f"oncebox.{name}.dead",
            },
        )
    new = RabbitQueue(url, name, prefetch=10, wait_s=0.5)
    try:
        new.declare()
        new.publish([message(7)])
        received = receive_all(new, 1)
        assert [r.message.message_id for r in received] == ["job-7"]
        new.ack(received)
        assert new.depth() == 0 and new.depth("given_up") == 0
    finally:
        new.delete()
        new.close()


def test_a_classic_queue_of_the_same_name_is_refused():
    import pika

    name = f"test-{uuid.uuid4().hex[:10]}"
    url = reachable(AMQP_URL)
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        connection.channel().queue_declare(f"oncebox.{name}", durable=True)
    new = RabbitQueue(url, name)
    try:
        with pytest.raises(BrokerRefused, match="inequivalent arg"):
            new.declare()
    finally:
        new.delete()
        new.close()


def test_a_batch_is_taken_at_its_commit_and_a_message_the_broker_cannot_route_is_named(queue):
    assert queue.publish_batch([message(n) for n in range(5)]) == set()
    assert queue.depth() == 5  # every one taken at the commit
    lost = RabbitQueue(queue.url, f"gone-{uuid.uuid4().hex[:8]}")  # never declared: no route
    try:
        assert lost.publish_batch([message(7), message(8)]) == {"job-7", "job-8"}
    finally:
        lost.close()


def test_retry_delays_round_up_to_the_ladder():
    assert [retry_delay_ms(ms) for ms in (0, 250, 251, 4_000, 10**12)] == [
        250,
        250,
        1_000,
        5_000,
        86_400_000,
    ]


def test_two_consumers_share_a_queue_each_message_going_to_one(queue):
    queue.publish([message(n) for n in range(20)])
    seen: list[str] = []
    lock = threading.Lock()

    def consume() -> None:
        mine = RabbitQueue(queue.url, queue.name.removeprefix("oncebox."), prefetch=5, wait_s=2.0)
        try:
            while got := mine.receive(5):
                with lock:
                    seen.extend(r.message.message_id for r in got)
                mine.ack(got)
        finally:
            mine.close()

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(seen) == sorted(f"job-{n}" for n in range(20))  # each once


def test_outbox_messages_reach_rabbitmq_once_each_under_their_rows_token(tmp_path):
    url = reachable(AMQP_URL)
    name = f"test-{uuid.uuid4().hex[:10]}"
    box = Box(f"sqlite:///{tmp_path / 'o.db'}", secret=SECRET)
    box.channel("events", provider=f"{url}?queue={name}")

    @box.task(key="order/{n}")
    def placed(ctx: JobContext, n: int) -> None:
        ctx.outbox.add("events", {"order": n})

    reader = RabbitQueue(url, name, wait_s=1.0)
    try:
        for n in range(5):
            box.enqueue(placed, n=n)
        assert drain(box).dispatched.sent == 5
        got = receive_all(reader, 5)
        assert sorted(json.loads(r.message.body)["order"] for r in got) == list(range(5))
        tokens = {row[0] for row in sql(box, "SELECT token FROM oncebox_outbox")}
        assert {r.message.message_id for r in got} == tokens  # the row's token, not its key
        assert all(r.message.headers["x-oncebox-channel"] == "events" for r in got)
        reader.ack(got)
        unacked_return(reader)
        assert reader.depth() == 0
    finally:
        reader.delete()
        reader.close()
        box.close()


def test_a_broker_that_cannot_be_reached_leaves_the_message_pending_for_a_retry(tmp_path):
    box = Box(f"sqlite:///{tmp_path / 'o.db'}", secret=SECRET)
    box.channel("events", provider="amqp://guest:guest@127.0.0.1:1/%2F?queue=never")

    @box.task(key="order/{n}")
    def placed(ctx: JobContext, n: int) -> None:
        ctx.outbox.add("events", {"order": n})

    try:
        box.enqueue(placed, n=1)
        result = drain(box)
        assert (result.dispatched.sent, result.dispatched.retried) == (0, 1)
        [(state, error)] = sql(box, "SELECT state, last_error FROM oncebox_outbox")
        assert state == "pending" and "RabbitMQ at amqp://127.0.0.1:1/" in error
    finally:
        box.close()


def test_a_rabbitmq_channel_must_name_its_queue(tmp_path):
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")
    try:
        with pytest.raises(ConfigurationError, match=r"amqp://HOST:5672/VHOST\?queue=NAME"):
            box.channel("events", provider="amqp://127.0.0.1/")
    finally:
        box.close()


def set_aside_after_its_deliveries(url: str, most: int = 2) -> bool:
    """A message taken and given back as failed `most` times (each a worker that died with it):
    whether RabbitMQ then set it aside for the sweep instead of delivering it again."""
    queue = RabbitQueue(f"{url}?max_deliveries={most}", f"test-{uuid.uuid4().hex[:10]}", wait_s=1)
    try:
        queue.declare()
        queue.publish([message(1)])
        for _ in range(most):
            [taken] = receive_all(queue, 1)
            queue.give_back([taken])
        again = queue.receive(1)
        return not again and queue.depth("given_up") == 1
    finally:
        queue.delete()
        queue.close()


def test_a_message_no_one_settles_is_set_aside_after_max_deliveries():
    assert set_aside_after_its_deliveries(reachable(AMQP_URL))


def test_a_message_no_one_settles_is_delivered_for_ever_without_the_delivery_limit():
    with mutated("rabbitmq-no-delivery-limit"):
        assert not set_aside_after_its_deliveries(reachable(AMQP_URL))
