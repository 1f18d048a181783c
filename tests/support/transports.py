"""The transports the contract suite (tests/test_transport_contract.py) runs against, each behind
one small harness: how a job is published and made deliverable, how a consumer lane is opened,
kept alive, and lost. The built-in table queue on both stores; RabbitMQ (the machine's real
broker) and SQS (the tests' own moto server), with their jobs recorded on PostgreSQL (the relay:
migration 0016)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from oncebox import Box, ConsumerConfig
from oncebox.brokers.brokered import wire_for
from oncebox.brokers.transport import BrokerTransport
from oncebox.kernel import clock
from oncebox.lanes.consumer import Consumer
from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.queue.transport import TableTransport
from oncebox.testing import FrozenClock

CONFIG = ConsumerConfig(batch_size=10, max_batch_size=10)


def consume_rounds(box: Box, transport: Any, rounds: int = 10, batch_size: int = 10) -> int:
    """Consumer rounds on `transport` (a lane of its own) until one finds nothing; how many
    deliveries they ran."""
    consumer = box.consumer(ConsumerConfig(batch_size=batch_size), transport=transport)
    ran = 0
    try:
        for _ in range(rounds):
            got = consumer.run_once().leased
            ran += got
            if not got:
                break
    finally:
        consumer.session.close()
    return ran


class TableHarness:
    """The built-in queue: a job is deliverable once enqueued; a lane's lease is its hold, kept
    alive by heartbeats, and lost when it runs out (the rescuer ends it)."""

    name = "table"
    acknowledges_after_commit = False  # the settlement is the acknowledgement, in the commit

    def __init__(self, box: Box, clock: FrozenClock) -> None:
        self.box = box
        self.clock = clock
        self.queue = "default"
        self._lanes: list[Consumer] = []

    def declare(self) -> None:
        """Nothing to declare: the table is the queue."""

    def deliver(self) -> int:
        """Nothing stands between an enqueue and a lease."""
        return 0

    def lane(self) -> Consumer:
        consumer = self.box.consumer(CONFIG, name=f"c{len(self._lanes)}")
        self._lanes.append(consumer)
        return consumer

    def keep_alive(self, lane: Consumer, hold_for: timedelta) -> None:
        """A heartbeat (the lease keeper's statement): the lane's leases run `hold_for` more."""
        self.box.store.job_lease_extend(lane.transport.held_tokens(), hold_for)

    def lose(self, lane: Consumer) -> None:
        """The lane's process is gone: its leases run out and the rescuer ends them."""
        assert isinstance(lane.transport, TableTransport)
        lane.session.close()
        self.time_passes(timedelta(hours=2))

    def time_passes(self, delta: timedelta) -> None:
        self.clock.advance(delta)
        LeaseRescuer(self.box.store, LeaseRescuerConfig(), self.box.metrics).run_once()

    def close(self) -> None:
        for lane in self._lanes:
            lane.session.close()


class BrokerHarness(TableHarness):
    """A broker's queue, jobs recorded on PostgreSQL: a job is deliverable once the relay
    published it; a lane is a `BrokerTransport` on the broker's wire."""

    name = "broker"
    acknowledges_after_commit = True

    def __init__(self, box: Box, clock: FrozenClock, broker: str) -> None:
        super().__init__(box, clock)
        self.broker = broker
        self.queue = f"contract-{uuid.uuid4().hex[:10]}"
        box.queue(self.queue, broker=broker)

    def _wire(self, **options: Any) -> Any:
        return wire_for(self.broker, self.queue, **options)

    def declare(self) -> None:
        setup = self._wire()
        try:
            setup.declare()
        finally:
            setup.close()

    def deliver(self) -> int:
        """The relay's pass: publish every due attempt."""
        return self.box.dispatcher().run_once().sent

    def lane(self) -> Consumer:
        transport = BrokerTransport(
            self._wire(prefetch=CONFIG.batch_size, wait_s=0.3),
            attempts=lambda task: self.box.registry.get(task).retry.max_attempts,
            now=self.box.store.clock_now,
            store=self.box.store,
            worker=f"contract-{len(self._lanes)}",
        )
        consumer = self.box.consumer(CONFIG, transport=transport, name=f"c{len(self._lanes)}")
        self._lanes.append(consumer)
        return consumer

    def close(self) -> None:
        for lane in self._lanes:
            lane.transport.close()  # type: ignore[attr-defined]
        super().close()
        setup = self._wire()
        try:
            setup.delete()
        finally:
            setup.close()


class RabbitHarness(BrokerHarness):
    """RabbitMQ: a lane's hold is its connection (no heartbeat to send), lost when the
    connection closes."""

    name = "rabbitmq"

    def keep_alive(self, lane: Consumer, hold_for: timedelta) -> None:
        """Nothing to send: RabbitMQ holds an unacknowledged message while its connection
        lives."""
        assert lane.transport.held_tokens() == []

    def lose(self, lane: Consumer) -> None:
        """The lane's connection closes: the broker delivers its unacknowledged messages
        again."""
        lane.transport.close()  # type: ignore[attr-defined]
        lane.session.close()


SQS_VISIBILITY_S = 3  # the contract queue's: SQS's hold, on the real clock


class SqsHarness(BrokerHarness):
    """SQS: a lane's hold is each message's visibility timeout, which runs on SQS's own clock —
    the real one. It is kept alive by extending it (the lease keeper's heartbeat), and lost by
    letting it run out: time passing here includes that much real time, since nothing moves
    SQS's clock (a wait for the fault itself, not for a result)."""

    name = "sqs"

    def keep_alive(self, lane: Consumer, hold_for: timedelta) -> None:
        lane.transport.keep_alive(hold_for)  # type: ignore[attr-defined]

    def lose(self, lane: Consumer) -> None:
        """The lane's process is gone: what it held becomes visible when its timeout runs out."""
        lane.transport.close()  # type: ignore[attr-defined]
        lane.session.close()
        self.time_passes(timedelta(hours=2))

    def time_passes(self, delta: timedelta) -> None:
        super().time_passes(delta)
        clock.sleep(SQS_VISIBILITY_S + 0.5)


NATS_ACK_WAIT_S = 3  # the contract stream's consumer's: JetStream's hold, on the real clock


class NatsHarness(SqsHarness):
    """NATS JetStream: a lane's hold is the consumer's `ack_wait`, on the server's (real)
    clock. An in-progress acknowledgement starts that wait again — once: so a lane kept alive
    is sent one every second while time passes, as the worker's lease keeper does; a hold not
    kept alive is lost by letting the wait run out."""

    name = "nats"

    def __init__(self, box: Box, clock: FrozenClock, broker: str) -> None:
        super().__init__(box, clock, broker)
        self._kept: list[tuple[Consumer, timedelta]] = []

    def keep_alive(self, lane: Consumer, hold_for: timedelta) -> None:
        super().keep_alive(lane, hold_for)
        self._kept.append((lane, hold_for))

    def time_passes(self, delta: timedelta) -> None:
        TableHarness.time_passes(self, delta)
        for _ in range(NATS_ACK_WAIT_S + 1):  # the keeper's heartbeats, a second apart
            clock.sleep(1.0)
            for lane, hold_for in self._kept:
                lane.transport.keep_alive(hold_for)  # type: ignore[attr-defined]


@contextmanager
def harness_for(kind: str, box: Box, clock: FrozenClock, broker: str | None) -> Iterator[Any]:
    harnesses: dict[str, type[BrokerHarness]] = {
        "rabbitmq": RabbitHarness,
        "sqs": SqsHarness,
        "nats": NatsHarness,
    }
    harness = (
        TableHarness(box, clock) if kind == "table" else harnesses[kind](box, clock, broker or "")
    )
    harness.declare()
    try:
        yield harness
    finally:
        harness.close()
