"""An in-memory RabbitMQ for the simulation: every answer a choice of the run, every call a
yield point.

`SimBroker` holds the queues; `SimQueue` is one connection to one of them, the wire
`brokers/transport.py`, the relay and the given-up sweep use (`Runtime.wire_for`). It is
RabbitMQ's wire (`brokers/rabbitmq/wire.py`) with pika's channel replaced: `declare`, `hand_back`,
`retry`, `dead` and `bury` are RabbitQueue's own, so the queues' arguments the real code declares
(the delivery limit, where given-up messages go) are what this broker obeys. What it does as
RabbitMQ does:

- a receive hands out ready messages in an order the run chooses (a returned message is not
  first in line), each held unacknowledged by the connection until acknowledged;
- a connection that closes or dies (its actor crashed: `YieldingStore.keep_for_crash`) returns
  what it held, each return counted; a rejection (`give_back`) is counted too. Why each
  delivery's return was counted is remembered (`counted`: rejected, its connection closed by
  its holder, lost under a call, or gone with its holder's process), for the checker. Past the main
  queue's `x-delivery-limit` returns a message is dead-lettered to its
  `x-dead-letter-routing-key` (RabbitMQ 4's default of 20 when no limit is declared);
- a queue with `x-message-ttl` (the retry ladder) expires its messages, on the world's clock,
  into its dead-letter routing key (back to the main queue);
- faults, while the run has them: an acknowledgement lost with its connection (what the
  connection held comes back), a publish whose connection drops before or after the broker took
  it (`maybe_published`).

Every message a consumed queue ever dead-lettered past its limit is remembered (`given_up_ever`,
wherever its arguments sent it), for the checker.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from oncebox.brokers.messages import GivenUp, Message, Received
from oncebox.brokers.rabbitmq.wire import RabbitQueue
from oncebox.kernel.errors import BrokerRefused, BrokerUnavailable
from oncebox.sim.choices import Choices
from oncebox.sim.scheduler import Scheduler

DEFAULT_DELIVERY_LIMIT = 20  # RabbitMQ 4's, on a quorum queue declared without one
# why a return was counted: a rejection, or the connection that held it closed by its holder,
# dropped under a call (a fault), or gone with its holder's process (a crash)
CAUSES = ("rejected", "closed", "lost", "died")
LOST = 0.05  # while faults run: an acknowledgement or a publish lost with its connection


@dataclass
class _Held:
    """A message in a queue, and how many times it came back unsettled."""

    message: Message
    returns: int = 0
    due: datetime | None = None  # in a queue with a TTL: when it expires onwards
    rejected_quiet: int = 0  # given back (rejected) once faults stopped


@dataclass
class _Unacked:
    held: _Held
    queue: str
    connection: int


@dataclass
class SimBroker:
    """See the module docstring. `now`: the world's clock; `keep_for_crash`: registers a
    connection to be closed when the actor that opened it dies."""

    scheduler: Scheduler
    choices: Choices
    now: Callable[[], datetime]
    keep_for_crash: Callable[[Any], None] = lambda _connection: None
    queues: dict[str, list[_Held]] = field(default_factory=dict)
    arguments: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    unacked: dict[int, _Unacked] = field(default_factory=dict)  # by delivery tag
    given_up_ever: list[Message] = field(default_factory=list)
    published: list[Message] = field(default_factory=list)
    rejected_twice: list[str] = field(default_factory=list)  # once quiet: message ids
    # why a delivery (by its tag) came back counted: one of CAUSES
    counted: dict[int, str] = field(default_factory=dict)
    handed_out: int = 0  # deliveries of the consumed queues (not the given-up sweep's)
    _tags: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _connections: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def wire(self, url: str, queue: str, *, prefetch: int = 100, wait_s: float = 1.0) -> SimQueue:
        """`Runtime.wire_for`: a new connection to `queue`."""
        return SimQueue(self, url, queue, prefetch=prefetch, wait_s=wait_s)

    # -- what the connections ask -------------------------------------------------------------

    def point(self, what: str) -> None:
        self.scheduler.point(f"broker.{what}")

    def lost(self) -> bool:
        """A fault of the run's choosing: the connection dropped under this call."""
        return self.scheduler.faults and self.choices.chance(LOST)

    def declare(self, name: str, arguments: Mapping[str, Any] | None, passive: bool) -> None:
        if passive:
            if name not in self.queues:
                raise BrokerRefused(f"no queue {name!r}")
            return
        self.queues.setdefault(name, [])
        self.arguments.setdefault(name, dict(arguments or {}))

    def put(self, queue: str, message: Message) -> None:
        if queue not in self.queues:
            raise BrokerRefused(f"the sim broker could not route a message to {queue!r}")
        ttl = self.arguments[queue].get("x-message-ttl")
        due = None if ttl is None else self.now() + timedelta(milliseconds=int(ttl))
        self.queues[queue].append(_Held(message, due=due))
        self.published.append(message)

    def take(self, queue: str, limit: int, connection: int, *, any_order: bool) -> list[Received]:
        """Up to `limit` ready messages of `queue`, held for `connection`."""
        self._expire()
        ready = self.queues.get(queue, [])
        found: list[Received] = []
        while ready and len(found) < limit:
            held = ready.pop(self.choices.below(len(ready)) if any_order else 0)
            tag = next(self._tags)
            self.unacked[tag] = _Unacked(held, queue, connection)
            found.append(Received(held.message, tag, held.returns > 0, connection))
        if not queue.endswith(".given-up"):
            self.handed_out += len(found)
        return found

    def settle(self, tags: Sequence[int]) -> None:
        for tag in tags:
            self.unacked.pop(tag, None)

    def requeue(self, tags: Sequence[int], cause: str) -> None:
        """Back to its queue, a return counted (`cause`: one of CAUSES): past the queue's
        limit, dead-lettered."""
        for tag in tags:
            unacked = self.unacked.pop(tag, None)
            if unacked is None:
                continue
            self.counted[tag] = cause
            held, queue = unacked.held, unacked.queue
            if cause == "rejected" and not self.scheduler.faults:
                held.rejected_quiet += 1
                if held.rejected_quiet == 2:
                    self.rejected_twice.append(held.message.message_id)
            held.returns += 1
            arguments = self.arguments.get(queue, {})
            limit = int(arguments.get("x-delivery-limit", DEFAULT_DELIVERY_LIMIT))
            onwards = arguments.get("x-dead-letter-routing-key")
            if held.returns > limit and onwards is not None:
                if not queue.endswith(".given-up"):  # the sweep's own: not a consumed queue
                    self.given_up_ever.append(held.message)
                held.returns = 0
                self.queues.setdefault(str(onwards), []).append(held)
                continue
            self.queues[queue].append(held)

    def drop_connection(self, connection: int, cause: str) -> None:
        """A connection gone: what it held comes back, each return counted."""
        self.requeue(self.holding(connection), cause)

    def holding(self, connection: int) -> list[int]:
        """The tags of the deliveries `connection` holds unacknowledged."""
        return sorted(t for t, u in self.unacked.items() if u.connection == connection)

    def _expire(self) -> None:
        """Messages past their queue's TTL, on to its dead-letter routing key."""
        now = self.now()
        for name, held in self.queues.items():
            onwards = self.arguments.get(name, {}).get("x-dead-letter-routing-key")
            if "x-message-ttl" not in self.arguments.get(name, {}) or onwards is None:
                continue
            due = [one for one in held if one.due is not None and one.due <= now]
            for one in due:
                held.remove(one)
                self.queues.setdefault(str(onwards), []).append(_Held(one.message))

    # -- what the checker reads ---------------------------------------------------------------

    def waiting(self) -> int:
        """Messages not yet settled: in a queue that is consumed (not the dead letters), or held
        by a connection."""
        counted = sum(len(held) for name, held in self.queues.items() if not name.endswith(".dead"))
        return counted + len(self.unacked)

    def returned(self, queue: str, times: int) -> list[Message]:
        """The messages of `queue` (ready or held) that came back unsettled `times` times or
        more."""
        held = [one for one in self.queues.get(queue, []) if one.returns >= times]
        held += [u.held for u in self.unacked.values() if u.queue == queue]
        return [one.message for one in held if one.returns >= times]

    def dead_letters(self, queue: str) -> list[Message]:
        return [held.message for held in self.queues.get(f"oncebox.{queue}.dead", [])]


class _Channel:
    """What RabbitQueue's `declare` asks of pika's channel."""

    def __init__(self, broker: SimBroker) -> None:
        self._broker = broker
        self.is_open = True

    def queue_declare(
        self,
        queue: str,
        durable: bool = False,
        arguments: Mapping[str, Any] | None = None,
        passive: bool = False,
    ) -> None:
        self._broker.declare(queue, arguments, passive)


class SimQueue(RabbitQueue):
    """One connection to one queue of a `SimBroker` (see the module docstring)."""

    def __init__(
        self, broker: SimBroker, url: str, queue: str, *, prefetch: int = 100, wait_s: float = 1.0
    ) -> None:
        super().__init__(url, queue, prefetch=prefetch, wait_s=wait_s)
        self.broker = broker
        self._sim_channel: _Channel | None = None
        self._connection_id = 0
        broker.keep_for_crash(_Death(self))

    def _open(self) -> Any:
        if self._sim_channel is None:
            self._sim_channel = _Channel(self.broker)
            self._connection_id = next(self.broker._connections)
            self._opened = self._connection_id
            self._channel = self._sim_channel  # type: ignore[assignment]
        return self._sim_channel

    def close(self) -> None:
        self.drop("closed")

    def drop(self, cause: str) -> None:
        """The connection gone (`cause`: closed, lost or died): what it held comes back."""
        if self._sim_channel is not None:
            self._sim_channel.is_open = False
            self.broker.drop_connection(self._connection_id, cause)
        self._sim_channel = None
        self._channel = None

    def holding(self) -> dict[int, str]:
        """What this connection holds unacknowledged: message ids by delivery tag."""
        if self._sim_channel is None:
            return {}
        held = self.broker.holding(self._connection_id)
        return {tag: self.broker.unacked[tag].held.message.message_id for tag in held}

    def _lose_connection(self, what: str, *, maybe_published: bool = False) -> BrokerUnavailable:
        self.drop("lost")
        return BrokerUnavailable(
            f"the sim broker's connection dropped ({what})", maybe_published=maybe_published
        )

    def declare(self) -> None:
        self.broker.point("declare")
        super().declare()

    def publish(self, messages: Sequence[Message], *, to: str | None = None) -> None:
        self.broker.point("publish")
        self._open()
        for message in messages:
            if self.broker.lost():
                taken = self.broker.choices.below(2) == 0
                if taken:
                    self.broker.put(to or self.name, message)
                raise self._lose_connection("publish", maybe_published=True)
            self.broker.put(to or self.name, message)

    def publish_batch(self, messages: Sequence[Message]) -> set[str]:
        self.broker.point("publish_batch")
        self._open()
        if self.broker.lost():
            if self.broker.choices.below(2) == 0:
                for message in messages:
                    self.broker.put(self.name, message)
            raise self._lose_connection("publish_batch", maybe_published=True)
        for message in messages:
            self.broker.put(self.name, message)
        return set()

    def receive(self, limit: int) -> list[Received]:
        self.broker.point("receive")
        self._open()
        return self.broker.take(self.name, limit, self._connection_id, any_order=True)

    def ack(self, received: Sequence[Received]) -> None:
        self.broker.point("ack")
        self._channel_of(received)
        if received and self.broker.lost():  # the acknowledgement lost with its connection
            raise self._lose_connection("ack")
        self.broker.settle([int(one.tag) for one in received])

    def give_back(self, received: Sequence[Received]) -> None:
        self.broker.point("give_back")
        self._channel_of(received)
        self.broker.requeue([int(one.tag) for one in received], "rejected")

    def prefetched(self) -> int:
        return 0  # a receive takes only what it hands out: nothing waits on the connection

    def given_up(self, limit: int) -> list[GivenUp]:
        self.broker.point("given_up")
        self._open()
        taken = self.broker.take(self.given_up_name, limit, self._connection_id, any_order=False)
        return [GivenUp(one.message, self.delivery_limit, one) for one in taken]


class _Death:
    """What a crash closes of a connection (`YieldingStore.keep_for_crash`): it goes with its
    holder's process, whose returns are counted as the process's death."""

    def __init__(self, queue: SimQueue) -> None:
        self.queue = queue

    def close(self) -> None:
        self.queue.drop("died")
