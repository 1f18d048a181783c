"""RabbitMQ's side of a broker-backed queue, on the machine's real server: confirmed publishes,
manual acknowledgements, redelivery after a lost acknowledgement, delayed retry through the TTL
ladder, dead letters with their headers. Each test declares queues of its own and deletes them."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from oncebox.transports.rabbitmq import (
    RETRY_LADDER_MS,
    BrokerRefused,
    BrokerUnavailable,
    Message,
    RabbitQueue,
    Received,
    retry_delay_ms,
)
from support.brokers import AMQP_URL, reachable


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


def message(n: int, **headers: object) -> Message:
    return Message(f'{{"n": {n}}}'.encode(), f"job-{n}", headers)


def test_a_confirmed_publish_is_received_and_gone_once_acknowledged(queue):
    queue.publish([message(1, key="k/1"), message(2)])
    received = queue.receive(10)
    assert [(r.message.message_id, r.message.headers) for r in received] == [
        ("job-1", {"key": "k/1"}),
        ("job-2", {}),
    ]
    assert not any(r.redelivered for r in received)
    queue.ack(received)
    assert queue.receive(10) == []
    assert queue.depth() == 0


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
    assert second.message.headers == {"x-delivery-count": 1}  # the quorum queue counts them


def test_a_retry_waits_its_rung_of_the_ladder_and_comes_back_with_its_headers(queue):
    queue.publish([message(1, attempt=1)])
    [got] = queue.receive(10)
    waited = queue.retry(got, delay_ms=100, headers={"attempt": 2})
    assert waited == RETRY_LADDER_MS[0]
    assert queue.depth() == 0  # acknowledged: the copy waits in the retry queue
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
    assert (queue.depth(), queue.depth("dead")) == (0, 1)
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
        mine = RabbitQueue(queue.url, queue.name.removeprefix("oncebox."), prefetch=5, wait_s=1.0)
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
