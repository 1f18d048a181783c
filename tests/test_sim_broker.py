"""The simulation's in-memory broker (`oncebox/sim/broker.py`): RabbitMQ's wire over queues in
memory, whose declared arguments it obeys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oncebox.brokers.messages import Message
from oncebox.chaos.mutations import mutated
from oncebox.kernel.errors import BrokerUnavailable
from oncebox.sim.broker import DEFAULT_DELIVERY_LIMIT, SimBroker
from oncebox.sim.choices import Choices
from oncebox.sim.scheduler import Scheduler

URL = "amqp://sim/?max_deliveries=3"
START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


class _Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now


def _broker(seed: int = 0, *, faults: bool = False) -> tuple[SimBroker, _Clock]:
    choices = Choices(seed)
    scheduler = Scheduler(choices)
    scheduler.faults = faults
    clock = _Clock()
    return SimBroker(scheduler, choices, clock), clock


def _message(n: int) -> Message:
    return Message(b'{"task":"ship","args":{"n":%d}}' % n, f"m{n}", {"x-oncebox-attempt": 1})


def test_a_delivery_its_connection_never_settled_comes_back_and_is_set_aside_past_the_limit():
    broker, _clock = _broker()
    publisher = broker.wire(URL, "q")
    publisher.declare()
    publisher.publish([_message(1)])
    for delivery in range(1, 4):
        consumer = broker.wire(URL, "q")
        [got] = consumer.receive(5)
        assert got.redelivered == (delivery > 1)
        consumer.close()  # its process died: the message comes back, the return counted
    assert broker.waiting() == 1  # set aside for the sweep, not delivered again
    assert broker.wire(URL, "q").receive(5) == []
    sweep = broker.wire(URL, "q")
    [given] = sweep.given_up(5)
    assert given.message.message_id == "m1" and given.deliveries == 3
    sweep.bury(given, {"x-oncebox-error": "gave up"})
    assert [m.message_id for m in broker.dead_letters("q")] == ["m1"]
    assert broker.waiting() == 0 and [m.message_id for m in broker.given_up_ever] == ["m1"]


def test_a_hand_back_is_a_copy_no_delivery_spent_and_a_give_back_counts():
    broker, _clock = _broker()
    wire = broker.wire(URL, "q")
    wire.declare()
    wire.publish([_message(1)])
    for _ in range(5):  # handed back unrun: never set aside
        [got] = wire.receive(1)
        wire.hand_back([got])
    [got] = wire.receive(1)
    for _ in range(2):
        wire.give_back([got])
        [got] = wire.receive(1)
    wire.give_back([got])  # the third counted return
    assert wire.receive(1) == [] and len(broker.given_up_ever) == 1


def test_a_retry_waits_on_the_ladder_until_the_clock_passes_its_delay():
    broker, clock = _broker()
    wire = broker.wire(URL, "q")
    wire.declare()
    wire.publish([_message(1)])
    [got] = wire.receive(1)
    assert wire.retry(got, 400, {"x-oncebox-attempt": 2}) == 1_000
    assert wire.receive(1) == []
    clock.now += timedelta(seconds=1)
    [again] = wire.receive(1)
    assert again.message.headers["x-oncebox-attempt"] == 2


def test_the_order_of_deliveries_is_the_seeds():
    orders = set()
    for seed in range(8):
        broker, _clock = _broker(seed)
        wire = broker.wire(URL, "q")
        wire.declare()
        wire.publish([_message(n) for n in range(4)])
        orders.add(tuple(one.message.message_id for one in wire.receive(4)))
    assert len(orders) > 1


def test_a_lost_acknowledgement_drops_the_connection_and_the_message_comes_back():
    for seed in range(200):
        broker, _clock = _broker(seed, faults=True)
        wire = broker.wire(URL, "q")
        broker.scheduler.faults = False
        wire.declare()
        wire.publish([_message(1)])
        [got] = wire.receive(1)
        broker.scheduler.faults = True
        try:
            wire.ack([got])
        except BrokerUnavailable:
            assert broker.waiting() == 1
            [again] = broker.wire(URL, "q").receive(1)
            assert again.redelivered
            return
        assert broker.waiting() == 0
    pytest.fail("no acknowledgement was lost in 200 seeds")


def test_a_queue_declared_without_our_delivery_limit_dead_letters_at_rabbitmqs_default():
    broker, _clock = _broker()
    with mutated("rabbitmq-no-delivery-limit"):
        broker.wire(URL, "q").declare()
    wire = broker.wire(URL, "q")
    wire.publish([_message(1)])
    for _ in range(DEFAULT_DELIVERY_LIMIT):
        [got] = wire.receive(1)
        wire.give_back([got])
    assert len(wire.receive(1)) == 1  # past our limit of 3: still delivered
    assert broker.given_up_ever == []


def test_a_message_returned_to_the_limit_is_named_while_it_is_still_delivered():
    broker, _clock = _broker()
    with mutated("rabbitmq-no-delivery-limit"):
        broker.wire(URL, "q").declare()
    wire = broker.wire(URL, "q")
    wire.publish([_message(1)])
    for _ in range(3):
        assert broker.returned("oncebox.q", 3) == []
        [got] = wire.receive(1)
        wire.give_back([got])
    assert [m.message_id for m in broker.returned("oncebox.q", 3)] == ["m1"]


def test_the_broker_records_why_it_counted_each_return():
    """A rejection, a connection its holder closed, one lost under a call, one gone with its
    holder's process: each return counted, and why (B6 reads it)."""
    kept: list[object] = []
    choices = Choices(0)
    scheduler = Scheduler(choices)
    broker = SimBroker(scheduler, choices, _Clock(), kept.append)
    wire = broker.wire(URL, "q")
    wire.declare()
    wire.publish([_message(n) for n in range(4)])
    [rejected] = wire.receive(1)
    wire.give_back([rejected])
    [closed] = wire.receive(1)
    wire.close()
    dying = broker.wire(URL, "q")
    [died] = dying.receive(1)
    kept[-1].close()  # type: ignore[attr-defined]  # its process died (`keep_for_crash`)
    losing, lost = broker.wire(URL, "q"), None
    while lost is None:  # an acknowledgement lost with its connection, by the run's choice
        [got] = losing.receive(1)
        scheduler.faults = True
        try:
            losing.ack([got])
        except BrokerUnavailable:
            lost = got
        scheduler.faults = False
        if lost is None:
            losing.publish([got.message])  # settled: the same message again, to try again
    assert [broker.counted[int(r.tag)] for r in (rejected, closed, died, lost)] == [
        "rejected",
        "closed",
        "died",
        "lost",
    ]
