"""`amqp://…?queue=NAME`: outbox messages published to a RabbitMQ queue, each confirmed.

A handler writes `ctx.outbox.add("events", {...})`; the row commits with the claim, and the
dispatcher publishes its frozen payload (JSON) to `oncebox.NAME`, declared on first use
(`brokers/rabbitmq.py`), with the row's token as the AMQP message id — stable across
attempts, so a consumer can recognise a second copy. RabbitMQ keeps no idempotency keys: a
publish whose confirm was lost with the connection is an unknown outcome (`SendAmbiguous`), held
or resent as the channel's `ambiguity` says; a broker that cannot be reached, or that refused
the message, is retried.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import timedelta
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from oncebox.brokers.messages import Message
from oncebox.brokers.rabbitmq import RabbitQueue
from oncebox.errors import BrokerRefused, BrokerUnavailable, ConfigurationError
from oncebox.providers.base import Outgoing, Receipt, SendAmbiguous, SendRetryable


class RabbitMQProvider:
    name = "rabbitmq"
    idempotent = False
    idempotency_window: timedelta | None = None

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
        queues = [value for name, value in query if name == "queue"]
        if len(queues) != 1 or not queues[0]:
            raise ConfigurationError(
                "a RabbitMQ channel names its queue: amqp://HOST:5672/VHOST?queue=NAME"
            )
        self.queue = queues[0]
        # the connection's own options (heartbeat, timeouts, TLS) stay with it
        rest = urlencode([(name, value) for name, value in query if name != "queue"])
        self.url = urlunsplit(parts._replace(query=rest))
        self._local = threading.local()  # pika's connections are one thread's each
        self._open: set[RabbitQueue] = set()
        self._open_lock = threading.Lock()

    def _opened(self) -> RabbitQueue:
        queue: RabbitQueue | None = getattr(self._local, "queue", None)
        if queue is None:
            queue = RabbitQueue(self.url, self.queue)
            with self._open_lock:
                self._open.add(queue)
            self._local.queue = queue
            queue.declare()
        return queue

    def _forget(self) -> None:
        queue: RabbitQueue | None = getattr(self._local, "queue", None)
        if queue is not None:
            queue.close()
            with self._open_lock:
                self._open.discard(queue)
        self._local.queue = None

    def close(self) -> None:
        """Close every thread's connection (when the box closes: its dispatchers are done)."""
        with self._open_lock:
            queues, self._open = list(self._open), set()
        for queue in queues:
            queue.close()
        self._local = threading.local()

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        body = json.dumps(outgoing.payload, separators=(",", ":"), sort_keys=True).encode()
        headers = {"x-oncebox-channel": outgoing.channel, "x-oncebox-attempt": outgoing.attempt}
        try:
            self._opened().publish([Message(body, outgoing.token, headers)])
        except BrokerRefused as exc:
            self._forget()  # declared again on the next send (the queue may have gone)
            raise SendRetryable(str(exc)) from None
        except BrokerUnavailable as exc:
            self._forget()  # the next send connects (and declares) afresh
            if exc.maybe_published:
                lost = f"{exc} (its confirm was lost: the broker may have taken it)"
                raise SendAmbiguous(lost) from None
            raise SendRetryable(str(exc)) from None
        return Receipt(outgoing.token, f"confirmed by RabbitMQ into {self.queue}")


class RabbitMQRelay(RabbitMQProvider):
    """The relay of a broker-held queue (`queue/brokered.py`): it publishes jobs, whose receiver
    keeps the key — a job's publish carries its job and attempt, and the consumer runs only the
    copy whose job still waits at that attempt, for as long as the job's row exists. So a lost
    confirm is simply published again (idempotent, no window), and the dispatcher records a
    batch of publishes together instead of marking each one `sending` first."""

    name = "rabbitmq-relay"
    idempotent = True
    idempotency_window: timedelta | None = None

    def send_batch(
        self, items: Sequence[tuple[Outgoing, str]]
    ) -> list[Receipt | SendRetryable | SendAmbiguous]:
        """Publish a batch in one broker transaction (`RabbitQueue.publish_batch`): each
        publish's receipt, or why it must be sent again."""
        messages = [
            Message(
                json.dumps(outgoing.payload, separators=(",", ":"), sort_keys=True).encode(),
                outgoing.token,
                {"x-oncebox-channel": outgoing.channel, "x-oncebox-attempt": outgoing.attempt},
            )
            for outgoing, _key in items
        ]
        try:
            returned = self._opened().publish_batch(messages)
        except BrokerRefused as exc:
            self._forget()
            return [SendRetryable(str(exc))] * len(items)
        except BrokerUnavailable as exc:
            self._forget()
            if exc.maybe_published:
                lost = f"{exc} (its commit was lost: the broker may have taken them)"
                return [SendAmbiguous(lost)] * len(items)
            return [SendRetryable(str(exc))] * len(items)
        if returned:
            self._forget()  # the queue went away: declared again on the next send
        taken = f"committed by RabbitMQ into {self.queue}"
        unroutable = f"RabbitMQ could not route it to {self.queue!r}"
        return [
            SendRetryable(unroutable)
            if outgoing.token in returned
            else Receipt(outgoing.token, taken)
            for outgoing, _key in items
        ]
