"""What a broker stops delivering (SQS's redrive, JetStream's `MaxDeliver`, RabbitMQ's quorum-queue
delivery limit) becomes an oncebox dead letter: a relayed job's row turns `dead` under its key,
with the reason, and is replayable like any dead job; an unrecorded message moves to the queue's
dead letters with the reason; and nothing is left where only the sweep looks. Before, such a job
waited `relayed` for ever, its message set aside where no one read it (on RabbitMQ, in its dead
letters). A delivery handed back unrun — a worker stopping — took no worker down, and is not
counted as one. The machine's RabbitMQ and NATS, the tests' SQS server; never a mock."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from oncebox import Box, ConfigurationError, ConsumerConfig, JobContext, Retry, WorkerConfig
from oncebox.brokers.brokered import wire_for
from oncebox.brokers.messages import Message
from oncebox.brokers.rabbitmq.wire import RabbitQueue
from oncebox.brokers.sqs.wire import ERROR, MAX_MESSAGE_BYTES, dead_copy, message_size
from oncebox.brokers.transport import BrokerTransport
from oncebox.chaos.mutations import mutated
from oncebox.jobs.dead_letters import DeadFilter
from oncebox.kernel.errors import StoreUnavailable
from oncebox.lanes.given_up import GivenUpSweep, GivenUpSweepResult
from support.brokers import AMQP_URL, NATS_URL, reachable, sqs_url
from support.db import create_effects, effects, record_effect
from support.transports import consume_rounds
from support.waiting import wait_until

PERIOD = "2026-W49"
MOST = 2  # the brokers' max_deliveries in these tests
HOLD_S = 2  # their holds (visibility, ack_wait): a message received and left comes back soon


@dataclass
class Held:
    box: Box
    broker: str
    queue: str
    wire: Any  # a raw connection that takes messages and gives them back, as dying workers do
    sweep: GivenUpSweep


@pytest.fixture(params=["sqs", "nats", "rabbitmq"])
def held(request: pytest.FixtureRequest, pg_url: str) -> Iterator[Held]:
    if request.param == "sqs":
        endpoint = request.getfixturevalue("sqs_endpoint")
        broker = f"{sqs_url(endpoint, visibility=HOLD_S)}&max_deliveries={MOST}"
    elif request.param == "nats":
        broker = f"{reachable(NATS_URL)}?ack_wait={HOLD_S}&max_deliveries={MOST}"
    else:  # a hold that lasts while its connection does
        broker = f"{reachable(AMQP_URL)}?max_deliveries={MOST}"
    queue = f"given-up-{uuid.uuid4().hex[:8]}"
    box = Box(pg_url, secret="given-up-tests-secret-0123456789")
    create_effects(box)

    # one attempt: an unrecorded task must retry fewer times than its broker delivers
    @box.task(
        key="weekly-digest/customer-{customer_id}/{period}",
        queue=queue,
        retry=Retry(max_attempts=1),
    )
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        record_effect(ctx, f"attempt {ctx.attempt}")

    box.queue(queue, broker=broker)
    wire = wire_for(broker, queue, wait_s=1)
    wire.declare()
    sweep = GivenUpSweep(box.store, {queue: broker}, wire_for, worker="t")
    try:
        yield Held(box, broker, queue, wire, sweep)
    finally:
        sweep.close()
        wire.delete()
        wire.close()
        box.close()


def die_holding_it(held: Held, sweep: bool = True) -> int:
    """Take the queue's message and give it back as a failed delivery, `MOST` times (each a
    worker that died with it), then until the broker has set it aside, sweep (or, without
    `sweep`, look); how many the sweep buried. Each round waits on the broker's own long poll,
    never a sleep."""
    try:
        for _ in range(MOST):
            [taken] = held.wire.receive(1)
            held.wire.give_back([taken])
        for _ in range(20):
            assert held.wire.receive(1) == []  # given up on: not delivered again
            if not sweep and held.wire.depth("given_up"):
                return 0
            swept = held.sweep.run_once() if sweep else GivenUpSweepResult()
            if buried := swept.dead_jobs + swept.dead_letters:
                return buried
        raise AssertionError("the broker never set the message aside")
    finally:
        held.wire.close()  # its consumer gone (RabbitMQ's would take the next message)


@pytest.mark.postgres
def test_a_relayed_job_its_broker_gave_up_on_is_dead_under_its_key_and_replayable(held: Held):
    box = held.box
    key = f"weekly-digest/customer-7/{PERIOD}"
    box.enqueue("weekly_digest", customer_id=7, period=PERIOD)
    assert box.dispatcher().run_once().sent == 1

    assert die_holding_it(held) == 1

    [dead] = box.find(key)
    assert dead.state == "dead" and dead.attempt == 1
    assert f"gave it up after {MOST} deliveries, none settled" in (dead.last_error or "")
    assert [d.key for d in box.dead_letters(DeadFilter(limit=10))] == [key]
    assert held.wire.depth("given_up") == 0 and held.sweep.run_once() == GivenUpSweepResult()

    box.replay(key, reason="the handler's memory leak is fixed")
    assert box.store.job_relay_adopt([held.queue], ["weekly_digest"], 10) == 1
    assert box.dispatcher().run_once().sent == 1
    consumer = lane(held)
    try:
        assert consume_rounds(box, consumer) == 1
    finally:
        consumer.close()
    assert effects(box) == [(key, "attempt 2")]
    assert box.find(key)[0].state == "done"


@pytest.mark.postgres
def test_a_worker_serving_the_queue_sweeps_what_its_broker_gave_up_on(held: Held):
    key = f"weekly-digest/customer-9/{PERIOD}"
    held.box.enqueue("weekly_digest", customer_id=9, period=PERIOD)
    assert held.box.dispatcher().run_once().sent == 1
    die_holding_it(held, sweep=False)

    held.box.work(config=WorkerConfig(until_idle=True))

    [dead] = held.box.find(key)
    assert dead.state == "dead" and "none settled" in (dead.last_error or "")
    assert held.wire.depth("given_up") == 0


def lane(held: Held, now: Callable[[], datetime] | None = None) -> BrokerTransport:
    box = held.box
    return BrokerTransport(
        wire_for(held.broker, held.queue, wait_s=1),
        attempts=lambda task: box.registry.get(task).retry.max_attempts,
        now=now or box.store.clock_now,
        store=box.store,
        worker="t",
    )


@pytest.mark.postgres
def test_a_store_outage_spends_none_of_a_messages_deliveries(held: Held):
    """A lane retrying through a store outage used to receive each time (then fail on the
    store), so the broker counted a delivery every hold: a healthy job was given up on."""
    box = held.box
    box.enqueue("weekly_digest", customer_id=10, period=PERIOD)
    assert box.dispatcher().run_once().sent == 1
    away = True

    def now() -> datetime:
        if away:
            raise StoreUnavailable("the store is away (the test's outage)")
        return box.store.clock_now()

    consumer = lane(held, now)
    try:
        # each fetch long-polls a second when it receives nothing: without the store's clock
        # read first, these six would have received the message every HOLD_S seconds
        for _ in range(3 * HOLD_S):
            with pytest.raises(StoreUnavailable):
                consumer.fetch(10)
        away = False
        assert consume_rounds(box, consumer) == 1  # never received: delivered now, and run
    finally:
        consumer.close()
    assert effects(box) == [(f"weekly-digest/customer-10/{PERIOD}", "attempt 1")]


@pytest.mark.postgres
def test_an_unrecorded_message_its_broker_gave_up_on_moves_to_the_dead_letters(held: Held):
    held.box.publish_unrecorded("weekly_digest", customer_id=8, period=PERIOD)

    assert die_holding_it(held) == 1

    assert held.wire.depth("dead") == 1 and held.wire.depth("given_up") == 0
    assert held.box.find("weekly-digest/customer-8/" + PERIOD) == []


@pytest.mark.postgres
def test_an_unrecorded_task_retrying_past_its_brokers_deliveries_is_refused(held: Held):
    @held.box.task(key="stubborn/{n}", queue=held.queue, retry=Retry(max_attempts=MOST + 1))
    def stubborn(ctx: JobContext, n: int) -> None:
        pass

    if not held.wire.attempt_is_delivery_count:  # RabbitMQ: the attempt travels in a header
        held.box.publish_unrecorded("stubborn", n=1)
        assert held.wire.depth() == 1
        return
    with pytest.raises(ConfigurationError, match=f"gives a message up after {MOST} deliveries"):
        held.box.publish_unrecorded("stubborn", n=1)
    assert held.wire.depth() == 0


@pytest.mark.postgres
def test_a_foreign_message_its_broker_gave_up_on_moves_to_the_dead_letters_named(held: Held):
    held.wire.publish([Message(b"not json at all", "foreign-1")])

    assert die_holding_it(held) == 1

    assert held.wire.depth("dead") == 1 and held.wire.depth("given_up") == 0


def test_a_dead_letter_near_sqs_s_cap_keeps_room_for_its_error():
    """A message near 1 MiB with a 4 000-character error would be refused by the dead letters,
    and wait set aside for ever: the error is cut to fit."""
    body = b"x" * (MAX_MESSAGE_BYTES - 2_000)
    copy = dead_copy(Message(body, "m-1", {"x-oncebox-channel": "c"}), {ERROR: "e" * 4_000})
    assert message_size(copy.body, {**copy.headers, "oncebox-id": "x" * 64}) <= MAX_MESSAGE_BYTES
    assert str(copy.headers[ERROR]).startswith("eee") and str(copy.headers[ERROR]).endswith("…")


def holding(lane: RabbitQueue, probe: RabbitQueue, jobs: int) -> Callable[[], bool]:
    """Has the lane's prefetch brought every message of the queue no receive took (the jobs'
    own, less those RabbitMQ set aside)? Then none is still on its way when the lane closes."""
    return lambda: lane.prefetched() == jobs - probe.depth("given_up")


def stop_round_after_round(held: Held) -> tuple[list[str], list[str]]:
    """Two jobs; round after round a worker takes one and stops before running it (on
    RabbitMQ, its lane's prefetch holding the rest when it closes); then a worker stays, and
    the sweep runs until neither job waits. The keys that ran, and those buried dead."""
    box = held.box
    for customer in (11, 12):
        box.enqueue("weekly_digest", customer_id=customer, period=PERIOD)
    assert box.dispatcher().run_once().sent == 2
    for _ in range(MOST + 1):
        stopping = lane(held)
        consumer = box.consumer(ConsumerConfig(batch_size=1, max_batch_size=1), transport=stopping)
        consumer.stopping = lambda: True
        try:
            consumer.run_once()
            if isinstance(stopping.queue, RabbitQueue):
                wire = held.wire
                wait_until(holding(stopping.queue, wire, 2), what="the rest in the prefetch")
        finally:
            consumer.session.close()
            stopping.close()
    staying = lane(held)
    try:
        consume_rounds(box, staying)
    finally:
        staying.close()
    wait_until(
        lambda: (held.sweep.run_once(), not box.store.job_count_by_state()["relayed"])[1],
        what="every job run, or swept from what its broker gave up on",
    )
    dead = [d.key for d in box.dead_letters(DeadFilter(limit=10))]
    return sorted(key for key, _ in effects(box)), sorted(str(key) for key in dead)


@pytest.mark.postgres
def test_a_worker_stopping_however_often_spends_none_of_its_jobs_deliveries(held: Held):
    """A job handed back unrun — a copy, the original acknowledged; on RabbitMQ what the
    lane's prefetch held too, when it closes — took no worker down: the broker, which gives a
    message up after `MOST` unsettled deliveries, counts none of those rounds, and both jobs run
    once a worker stays, each on its first attempt."""
    keys = [f"weekly-digest/customer-{c}/{PERIOD}" for c in (11, 12)]
    assert stop_round_after_round(held) == (keys, [])
    assert sorted(effects(held.box)) == [(key, "attempt 1") for key in keys]


@pytest.mark.postgres
def test_a_worker_stopping_buries_jobs_that_never_ran_without_the_hand_back(held: Held):
    """Each round counted as a delivery that took a worker down, as before: a job never run is
    given up on by its broker, and buried dead."""
    with mutated("counted-give-back"):
        ran, dead = stop_round_after_round(held)
    assert dead and not set(dead) & set(ran), (ran, dead)
