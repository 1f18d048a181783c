"""An oncebox queue's RabbitMQ side: its queues, confirmed publishes, acknowledgements.

For an oncebox queue Q, all durable, all named `oncebox.Q…` so several apps can share a vhost:

- `oncebox.Q`: a quorum queue (replicated, and it keeps a message through a broker restart),
  read with manual acknowledgements and a prefetch;
- `oncebox.Q.retry.<ms>`: one classic queue per retry delay, whose messages expire after that
  delay and are dead-lettered back into `oncebox.Q` — delayed retry without the
  delayed-message plugin, which Debian's server does not ship. Delays are rounded up to a
  ladder (`RETRY_LADDER_MS`), so a handful of queues serve every backoff;
- `oncebox.Q.dead`: the dead letters, each carrying its key and attempt history in headers.

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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from oncebox.brokers.messages import Message, Received
from oncebox.errors import BrokerRefused, BrokerUnavailable

PREFIX = "oncebox."
PERSISTENT = 2  # AMQP delivery mode: written to disk (pika.DeliveryMode.Persistent)
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

    def __init__(self, url: str, queue: str, *, prefetch: int = 100, wait_s: float = 1.0) -> None:
        self.url = url
        self.name = f"{PREFIX}{queue}"
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
        that name declared otherwise (a classic queue, other arguments) is `BrokerRefused`."""
        with self._wire("declare"):
            channel = self._open()
            quorum = {"x-queue-type": "quorum"}
            # a message the broker itself gives up on (RabbitMQ 4's default delivery limit, 20
            # deliveries without an acknowledgement) goes to the dead letters, not nowhere
            dead_letters = {
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": f"{self.name}.dead",
            }
            channel.queue_declare(self.name, durable=True, arguments={**quorum, **dead_letters})
            channel.queue_declare(f"{self.name}.dead", durable=True, arguments=quorum)
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
            names = (self.name, f"{self.name}.dead", *map(self._retry_queue, RETRY_LADDER_MS))
            for name in names:
                channel.queue_delete(name)

    def depth(self, which: str = "") -> int:
        """Messages ready in the queue (`which`: "" or "dead"), not counting unacknowledged."""
        name = self.name if not which else f"{self.name}.{which}"
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
        """Back to the queue at once, for another consumer (a shutdown, a release)."""
        channel = self._channel_of(received)
        with self._wire("give back to"):
            for one in received:
                if channel is not None:
                    channel.basic_nack(int(one.tag), requeue=True)

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


def _parameters(url: str) -> pika.URLParameters:
    """The connection's parameters, as the URL gives them, with two defaults of oncebox's: no
    heartbeat (a blocking connection cannot answer one while a handler runs, so the broker
    would cut a lane that runs a long batch; a dead process closes its socket anyway), and a
    publish blocked by a broker alarm gives up after 30 s instead of hanging."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.setdefault("heartbeat", "0")
    query.setdefault("blocked_connection_timeout", "30")
    return pika.URLParameters(urlunsplit(parts._replace(query=urlencode(query))))


def _shown(url: str) -> str:
    """The URL without its password, for a message."""
    params = pika.URLParameters(url)
    return f"amqp://{params.host}:{params.port}{params.virtual_host and '/' + params.virtual_host}"
