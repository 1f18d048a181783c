"""An oncebox queue's RabbitMQ side: its queues, confirmed publishes, acknowledgements.

For an oncebox queue Q, all durable, all named `oncebox.Q…` so several apps can share a vhost:

- `oncebox.Q`: a quorum queue (replicated, and it keeps a message through a broker restart),
  read with manual acknowledgements and a prefetch;
- `oncebox.Q.retry.<ms>`: one classic queue per retry delay, whose messages expire after that
  delay and are dead-lettered back into `oncebox.Q` — delayed retry without the
  delayed-message plugin, which Debian's server does not ship. Delays are rounded up to a
  ladder (`RETRY_LADDER_MS`), so a handful of queues serve every backoff;
- `oncebox.Q.dead`: the dead letters, each carrying its key and attempt history in headers;
- `oncebox.Q.given-up`: where RabbitMQ itself sets a message aside once it has been delivered
  `max_deliveries` times (a URL option, 50 by default: the quorum queue's `x-delivery-limit`)
  and never settled — a handler that takes its worker down, workers that keep dying. Nothing
  consumes it but the workers' sweep (`lanes/given_up.py`), which makes each an oncebox
  dead letter: a relayed job's row turns `dead`, an unrecorded message moves to `.dead` with
  the reason. A queue's arguments cannot change once declared: a main queue declared with
  another `max_deliveries`, or by an oncebox before this one, is used as it is (refusing it
  would stop a rolling deploy's new workers), with a warning — there RabbitMQ sets nothing
  aside at our limit (RabbitMQ 4's own default of 20 dead-letters to `.dead`, and such a job
  waits `relayed`) until the queue is deleted once drained and declared afresh.

A message goes back to the queue in one of two ways. `give_back` returns it as a failed
delivery, which RabbitMQ counts toward the limit (a reject: RabbitMQ 4.3 no longer counts a
negative acknowledgement); `hand_back` returns one that never ran — a worker shutting down, the
prefetch it had not taken — as a copy published before the original is acknowledged, which no
version counts (RabbitMQ before 4.3 counts every return). Its attempt travels in its headers or
its body, so the copy is the same message to its consumer; it joins the back of the queue.

Every publish waits for the broker's confirm and is mandatory: a message the broker could not
route or did not take raises `BrokerRefused`, and nothing is acknowledged before what replaces it
(a retry, a dead letter) is confirmed. A consumer that dies between the two leaves both copies:
the broker redelivers the original. A copy of a job that then succeeds is absorbed by the claim
on its business key — the key, not the broker, carries the guarantee; but failed attempts hold
no claim, so until one succeeds both copies run (a retry budget spent twice as fast, perhaps two
dead letters: their readers should recognise the message id).

Connections: no AMQP heartbeat by default (a blocking connection cannot answer one while a
handler runs; a dead process closes its socket anyway) — a URL may set `heartbeat=` — and a
channel is checked alive before anything is sent on it. A delivery is settled only on the
channel it came on: when that channel is gone, the broker delivers the message again.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from oncebox.brokers.messages import GivenUp, Message, Received
from oncebox.kernel.errors import BrokerRefused, BrokerUnavailable, ConfigurationError

log = logging.getLogger("oncebox.rabbitmq")

PREFIX = "oncebox."
PERSISTENT = 2  # AMQP delivery mode: written to disk (pika.DeliveryMode.Persistent)
MAX_DELIVERIES = 50  # the quorum queue's delivery limit, in deliveries, unless the URL says
OPTIONS = ("max_deliveries",)  # oncebox's own options in a RabbitMQ URL, not pika's
# the main queue's arguments this release added: a queue declared without them is kept as it is
_LIMIT_ARGUMENTS = ("x-delivery-limit", "x-dead-letter-routing-key")
_KEPT_AS_DECLARED: set[str] = set()  # the queues this process has warned about
# what RabbitMQ writes on a delivery, not part of the message a copy carries
_DELIVERY_HEADERS = ("x-delivery-count", "x-acquired-count")
# retry delays a queue is declared for, in ms: a wanted delay is rounded up to the next one
RETRY_LADDER_MS = (
    250,
    1_000,
    5_000,
    15_000,
    60_000,
    300_000,
    900_000,
    3_600_000,
    21_600_000,
    86_400_000,
)


def retry_delay_ms(wanted_ms: float) -> int:
    """The ladder's delay a retry waits: the smallest at least `wanted_ms` (the longest for
    more)."""
    index = bisect.bisect_left(RETRY_LADDER_MS, max(0.0, wanted_ms))
    return RETRY_LADDER_MS[min(index, len(RETRY_LADDER_MS) - 1)]


class RabbitQueue:
    """One oncebox queue on one RabbitMQ connection (one thread's: pika's blocking connection is
    not shared)."""

    # a delivery's attempt travels in its headers (unrecorded) or body (relayed), never in
    # RabbitMQ's delivery count: a copy is the same message (`brokers/transport.py`)
    attempt_is_delivery_count = False

    def __init__(self, url: str, queue: str, *, prefetch: int = 100, wait_s: float = 1.0) -> None:
        self.url = url
        self.name = f"{PREFIX}{queue}"
        self.given_up_name = f"{self.name}.given-up"
        ours = dict(q for q in parse_qsl(urlsplit(url).query) if q[0] in OPTIONS)
        try:
            self.delivery_limit = int(ours.get("max_deliveries", MAX_DELIVERIES))
        except ValueError:
            self.delivery_limit = 0
        if self.delivery_limit < 1:
            raise ConfigurationError("a RabbitMQ broker's max_deliveries is a number, at least 1")
        self.prefetch = prefetch
        self.wait_s = wait_s  # how long `receive` waits for a first message
        self._connection: pika.BlockingConnection | None = None
        self._channel: BlockingChannel | None = None
        self._tx_channel: BlockingChannel | None = None  # `publish_batch`'s
        self._returned: list[str] = []  # message ids it returned (unroutable), this batch
        self._opened = 0  # channels opened so far: the number of the current one

    # -- connection ----------------------------------------------------------------------------

    def _open(self) -> BlockingChannel:
        """This thread's channel: the open one, checked alive first (a connection idle past the
        broker's heartbeat, or cut, is found here, before anything is sent on it), or a new
        connection."""
        if self._channel is not None and self._channel.is_open and self._connection is not None:
            try:
                self._connection.process_data_events(0)
            except pika.exceptions.AMQPError:
                self.close()  # dead: nothing was sent on it; open afresh below
            else:
                return self._channel
        self.close()
        try:
            self._connection = pika.BlockingConnection(_parameters(self.url))
            channel = self._connection.channel()
            channel.confirm_delivery()
            channel.basic_qos(prefetch_count=self.prefetch)
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise BrokerUnavailable(f"RabbitMQ at {_shown(self.url)}: {exc!r}") from None
        self._channel = channel
        self._opened += 1
        return channel

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._tx_channel = None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):  # already going
                connection.close()

    # -- topology ------------------------------------------------------------------------------

    def declare(self) -> None:
        """Declare the queue, its dead letters and its retry ladder (idempotent). A queue of
        that name declared otherwise (a classic queue) is `BrokerRefused`. One declared by an
        oncebox before delivery limits, or with another `max_deliveries`, is used as it is,
        with a warning: RabbitMQ fixes a queue's arguments at its first declare, and refusing
        it would stop a rolling deploy's new workers beside the old ones."""
        quorum = {"x-queue-type": "quorum"}
        # what RabbitMQ gives up on is set aside for the sweep; what the sweep fails to settle
        # (RabbitMQ 4 limits every quorum queue's deliveries) goes to the dead letters, not
        # nowhere
        given_up = {
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.given_up_name,
            # RabbitMQ counts returns: `delivery_limit` deliveries, then set aside
            "x-delivery-limit": self.delivery_limit - 1,
        }
        dead_letters = {
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": f"{self.name}.dead",
        }
        self._declare_main({**quorum, **given_up})
        with self._wire("declare"):
            channel = self._open()
            channel.queue_declare(f"{self.name}.dead", durable=True, arguments=quorum)
            channel.queue_declare(
                self.given_up_name, durable=True, arguments={**quorum, **dead_letters}
            )
            for delay in RETRY_LADDER_MS:
                channel.queue_declare(
                    self._retry_queue(delay),
                    durable=True,
                    arguments={
                        "x-message-ttl": delay,
                        "x-dead-letter-exchange": "",
                        "x-dead-letter-routing-key": self.name,
                    },
                )

    def _declare_main(self, arguments: dict[str, object]) -> None:
        try:
            with self._wire("declare"):
                self._open().queue_declare(self.name, durable=True, arguments=arguments)
        except BrokerRefused as exc:
            if not any(f"inequivalent arg '{name}'" in str(exc) for name in _LIMIT_ARGUMENTS):
                raise
            with self._wire("declare"):
                self._open().queue_declare(self.name, durable=True, passive=True)
            if self.name not in _KEPT_AS_DECLARED:
                _KEPT_AS_DECLARED.add(self.name)
                log.warning(
                    "RabbitMQ queue %r was declared by an earlier oncebox or with another "
                    "max_deliveries, and its arguments cannot change: it is used as it is, so "
                    "RabbitMQ does not set a message aside after max_deliveries=%d deliveries "
                    "there; to apply it, delete the queue once it is drained (it is declared "
                    "afresh)",
                    self.name,
                    self.delivery_limit,
                )

    @contextlib.contextmanager
    def _wire(self, what: str) -> Iterator[None]:
        """Broker errors as oncebox's: the broker refusing (a channel it closed) or away."""
        try:
            yield
        except pika.exceptions.ChannelClosedByBroker as exc:
            self.close()
            raise BrokerRefused(f"RabbitMQ refused to {what} {self.name!r}: {exc}") from None
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.close()
            raise BrokerUnavailable(f"RabbitMQ at {_shown(self.url)}: {exc!r}") from None

    def delete(self) -> None:
        """Remove the queue and its companions (tests, and an app retiring a queue)."""
        with self._wire("delete"):
            channel = self._open()
            names = (
                self.name,
                f"{self.name}.dead",
                self.given_up_name,
                *map(self._retry_queue, RETRY_LADDER_MS),
            )
            for name in names:
                channel.queue_delete(name)

    def depth(self, which: str = "") -> int:
        """Messages ready in the queue (`which`: "", "dead" or "given_up": set aside, not yet
        swept), not counting unacknowledged."""
        name = {"": self.name, "given_up": self.given_up_name}.get(which, f"{self.name}.{which}")
        with self._wire("read"):
            declared = self._open().queue_declare(name, passive=True)
        return int(declared.method.message_count or 0)

    def _retry_queue(self, delay_ms: int) -> str:
        return f"{self.name}.retry.{delay_ms}ms"

    # -- publish -------------------------------------------------------------------------------

    def publish(self, messages: Sequence[Message], *, to: str | None = None) -> None:
        """Publish, each confirmed by the broker before the next (mandatory: an unroutable
        message raises `BrokerRefused`)."""
        channel = self._open()
        for message in messages:
            self._publish(channel, to or self.name, message)

    def _publish(self, channel: BlockingChannel, queue: str, message: Message) -> None:
        properties = pika.BasicProperties(
            message_id=message.message_id,
            headers=dict(message.headers),
            delivery_mode=PERSISTENT,
            content_type="application/json",
        )
        try:
            channel.basic_publish("", queue, message.body, properties, mandatory=True)
        except pika.exceptions.UnroutableError:
            raise BrokerRefused(f"RabbitMQ could not route a message to {queue!r}") from None
        except pika.exceptions.NackError:
            raise BrokerRefused(f"RabbitMQ refused a message for {queue!r}") from None
        except (pika.exceptions.AMQPError, OSError) as exc:
            # the connection was checked alive just before (`_open`): lost while the publish
            # waited for its confirm, which the broker may have taken
            self.close()
            raise BrokerUnavailable(
                f"RabbitMQ at {_shown(self.url)}: {exc!r}", maybe_published=True
            ) from None

    def publish_batch(self, messages: Sequence[Message]) -> set[str]:
        """Publish many in one AMQP transaction on a channel of their own: the broker takes
        responsibility for all of them at its commit-ok (RabbitMQ's tx is a batch: durability
        and routing are settled on commit), one round trip instead of one confirm each. Returns
        the message ids the broker could not route (mandatory: returned on commit). A lost
        connection while committing raises `BrokerUnavailable(maybe_published=True)`."""
        channel = self._batch_channel()
        self._returned = []
        with self._wire("publish to"):
            for message in messages:
                channel.basic_publish(
                    "",
                    self.name,
                    message.body,
                    pika.BasicProperties(
                        message_id=message.message_id,
                        headers=dict(message.headers),
                        delivery_mode=PERSISTENT,
                        content_type="application/json",
                    ),
                    mandatory=True,
                )
            try:
                channel.tx_commit()
                assert self._connection is not None
                self._connection.process_data_events(0)  # the returns the commit brought
            except pika.exceptions.ChannelClosedByBroker:
                raise
            except (pika.exceptions.AMQPError, OSError) as exc:
                self.close()
                raise BrokerUnavailable(
                    f"RabbitMQ at {_shown(self.url)}: {exc!r}", maybe_published=True
                ) from None
        return set(self._returned)

    def _batch_channel(self) -> BlockingChannel:
        """This connection's transactional channel (a channel in confirm mode cannot be one)."""
        self._open()
        if self._tx_channel is None or not self._tx_channel.is_open:
            assert self._connection is not None
            with self._wire("open a transaction on"):
                self._tx_channel = self._connection.channel()
                self._tx_channel.tx_select()
                self._tx_channel.add_on_return_callback(self._on_return)
        return self._tx_channel

    def _on_return(self, *delivered: Any) -> None:
        """pika's (channel, method, properties, body) of a message the broker returned."""
        self._returned.append(delivered[2].message_id or "")

    # -- consume -------------------------------------------------------------------------------

    def receive(self, limit: int) -> list[Received]:
        """Up to `limit` messages: waits at most `wait_s` for the first, then takes only what
        the prefetch has already brought."""
        channel = self._open()
        found: list[Received] = []
        try:
            for method, properties, body in channel.consume(
                self.name, inactivity_timeout=self.wait_s
            ):
                if method is None or properties is None or body is None:
                    break  # nothing came within wait_s
                found.append(
                    Received(
                        Message(body, properties.message_id or "", properties.headers or {}),
                        int(method.delivery_tag or 0),
                        bool(method.redelivered),
                        self._opened,
                    )
                )
                if len(found) >= limit or not channel.get_waiting_message_count():
                    break
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.close()
            raise BrokerUnavailable(f"RabbitMQ at {_shown(self.url)}: {exc!r}") from None
        return found

    def ack(self, received: Sequence[Received]) -> None:
        """Acknowledge on the channel the messages came on. A channel lost meanwhile cannot: the
        broker delivers them again (`BrokerUnavailable`)."""
        channel = self._channel_of(received)
        with self._wire("acknowledge on"):
            for one in received:
                if channel is not None:
                    channel.basic_ack(int(one.tag))

    def give_back(self, received: Sequence[Received]) -> None:
        """Back to the queue at once as a failed delivery, which RabbitMQ counts toward its
        delivery limit (a consumer that failed with it, its store away mid-batch)."""
        channel = self._channel_of(received)
        with self._wire("give back to"):
            for one in received:
                if channel is not None:
                    channel.basic_reject(int(one.tag), requeue=True)

    def hand_back(self, received: Sequence[Received]) -> None:
        """Back to the queue unrun (a shutdown, a release), no delivery spent: a copy each,
        confirmed, then the originals acknowledged. A consumer that dies in between leaves both:
        the job's row or the claim absorbs the second."""
        if not received:
            return
        self._channel_of(received)  # gone: the broker delivers them again; publish no copy
        self.publish([_copy(one.message) for one in received])
        self.ack(received)

    def prefetched(self) -> int:
        """Messages the prefetch brought to this connection that no `receive` took yet."""
        channel, connection = self._channel, self._connection
        if channel is None or connection is None or not channel.is_open:
            return 0
        with self._wire("read from"):
            connection.process_data_events(0)  # what has arrived
            return channel.get_waiting_message_count()

    def hand_back_prefetched(self) -> None:
        """Hand back what the prefetch brought and no one took, before a consumer's connection
        closes (its worker stopping): closed with it, they would return as deliveries RabbitMQ
        counts. The consumer is cancelled before they are acknowledged, so nothing more comes
        (a delivery still on its way then is refused by the client, and counted)."""
        waiting = self.prefetched()
        channel = self._channel
        if not waiting or channel is None:
            return
        with self._wire("hand back to"):
            taken: list[Received] = []
            for method, properties, body in channel.consume(self.name, inactivity_timeout=0):
                if method is None or properties is None or body is None:
                    break
                message = Message(body, properties.message_id or "", properties.headers or {})
                taken.append(Received(message, int(method.delivery_tag or 0), True, self._opened))
                if len(taken) >= waiting:
                    break
            channel.cancel()
        self.hand_back(taken)

    def _channel_of(self, received: Sequence[Received]) -> BlockingChannel | None:
        """The channel that delivered `received`, if it is still the open one: a delivery tag
        means nothing on another channel, and a message whose channel is gone is the broker's
        to deliver again (`BrokerUnavailable`). None when there is nothing to settle."""
        if not received:
            return None
        channel = self._channel
        current = channel is not None and channel.is_open
        if not current or any(one.channel != self._opened for one in received):
            raise BrokerUnavailable(
                f"RabbitMQ at {_shown(self.url)}: the channel these came on is closed; the "
                "broker delivers them again"
            )
        return channel

    def retry(self, received: Received, delay_ms: float, headers: Mapping[str, Any]) -> int:
        """Publish the message again to wait in the retry queue for at least `delay_ms` (with
        `headers` merged in), then acknowledge the original; the delay it will wait."""
        self._channel_of([received])  # gone: the broker delivers it again; publish no copy
        delay = retry_delay_ms(delay_ms)
        message = received.message
        again = Message(message.body, message.message_id, {**message.headers, **headers})
        self.publish([again], to=self._retry_queue(delay))
        self.ack([received])
        return delay

    def dead(self, received: Received, headers: Mapping[str, Any]) -> None:
        """Move the message to the dead letters with `headers` merged in (the key, the attempt
        history), then acknowledge the original."""
        self._channel_of([received])  # gone: the broker delivers it again; publish no copy
        message = received.message
        dead = Message(message.body, message.message_id, {**message.headers, **headers})
        self.publish([dead], to=f"{self.name}.dead")
        self.ack([received])

    # -- what RabbitMQ gave up on ---------------------------------------------------------------

    def given_up(self, limit: int) -> list[GivenUp]:
        """Up to `limit` messages RabbitMQ set aside after `max_deliveries` deliveries, held
        (unacknowledged) by this connection until `bury`."""
        channel = self._open()
        found: list[GivenUp] = []
        with self._wire("read what was given up in"):
            while len(found) < limit:
                method, properties, body = channel.basic_get(self.given_up_name)
                if method is None or properties is None or body is None:
                    break
                raw = body.encode() if isinstance(body, str) else body  # pika's stubs say str
                message = Message(raw, properties.message_id or "", properties.headers or {})
                held = Received(message, int(method.delivery_tag or 0), True, self._opened)
                found.append(GivenUp(message, self.delivery_limit, held))
        return found

    def bury(self, given: GivenUp, headers: Mapping[str, Any] | None) -> None:
        """Done with a message RabbitMQ gave up on: with `headers`, moved to the dead letters
        with them merged in (an unrecorded message); without, acknowledged (a relayed job, whose
        row the sweep made dead first)."""
        held: Received = given.handle
        if headers is not None:
            self._channel_of([held])  # gone: set aside again; publish no copy
            message = _copy(given.message)
            dead = Message(message.body, message.message_id, {**message.headers, **headers})
            self.publish([dead], to=f"{self.name}.dead")
        self.ack([held])


def _copy(message: Message) -> Message:
    """`message` as it was published, without what RabbitMQ wrote on its delivery."""
    headers = {k: v for k, v in message.headers.items() if k not in _DELIVERY_HEADERS}
    return Message(message.body, message.message_id, headers)


def _parameters(url: str) -> pika.URLParameters:
    """The connection's parameters, as the URL gives them, with two defaults of oncebox's: no
    heartbeat (a blocking connection cannot answer one while a handler runs, so the broker
    would cut a lane that runs a long batch; a dead process closes its socket anyway), and a
    publish blocked by a broker alarm gives up after 30 s instead of hanging."""
    parts = urlsplit(url)
    query = {k: v for k, v in parse_qsl(parts.query) if k not in OPTIONS}
    query.setdefault("heartbeat", "0")
    query.setdefault("blocked_connection_timeout", "30")
    return pika.URLParameters(urlunsplit(parts._replace(query=urlencode(query))))


def _shown(url: str) -> str:
    """The URL without its password, for a message."""
    params = _parameters(url)
    return f"amqp://{params.host}:{params.port}{params.virtual_host and '/' + params.virtual_host}"
