"""The relay of a queue a broker holds, through its wire's batch publish (RabbitMQ: one AMQP
transaction; SQS: ten per call; NATS JetStream: all at once, each acknowledged by the stream).

Its receiver keeps the key —
the consumer runs only the copy whose job still waits at the attempt it carries — so it is
idempotent with no window: a batch whose answer was lost is sent again, and the dispatcher
records a batch of publishes together. A broker that answers per message (SQS) names the ones it
did not take: those are retried.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from oncebox.brokers.messages import Message
from oncebox.kernel.errors import BrokerRefused, BrokerUnavailable, ConfigurationError
from oncebox.providers.base import (
    Capabilities,
    Outgoing,
    Receipt,
    SendAmbiguous,
    SendRetryable,
)

GROUP = "x-oncebox-group"


class BrokerRelay:
    idempotent = True
    idempotency_window: timedelta | None = None
    capabilities = Capabilities(send_batch=True, close=True)

    def __init__(
        self,
        url: str,
        *,
        name: str,
        wire: Callable[[str, str], Any],
        what: str = "a relay",
        form: str | None = None,  # the URL's shape, for the error (else the URL given)
    ) -> None:
        self.name = name
        self._wire = wire  # (broker URL, queue) -> a connection to that queue (`brokers/`)
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
        queues = [value for name, value in query if name == "queue"]
        if len(queues) != 1 or not queues[0]:
            where = form or url.split("?", maxsplit=1)[0]
            raise ConfigurationError(f"{what} names its queue: {where}?queue=NAME")
        self.queue = queues[0]
        rest = urlencode([(name, value) for name, value in query if name != "queue"])
        self.url = urlunsplit(parts._replace(query=rest))
        self._local = threading.local()  # a connection per dispatcher thread
        self._open: set[Any] = set()
        self._open_lock = threading.Lock()

    def _opened(self) -> Any:
        queue: Any = getattr(self._local, "queue", None)
        if queue is None:
            queue = self._wire(self.url, self.queue)
            with self._open_lock:
                self._open.add(queue)
            self._local.queue = queue
            queue.declare()
        return queue

    def _forget(self) -> None:
        queue: Any = getattr(self._local, "queue", None)
        if queue is not None:
            queue.close()
            with self._open_lock:
                self._open.discard(queue)
        self._local.queue = None

    def close(self) -> None:
        with self._open_lock:
            queues, self._open = list(self._open), set()
        for queue in queues:
            queue.close()
        self._local = threading.local()

    @staticmethod
    def _message(outgoing: Outgoing) -> Message:
        payload = outgoing.payload
        headers = {"x-oncebox-channel": outgoing.channel}
        group = payload.get("group") if isinstance(payload, dict) else None
        if group is not None:
            headers[GROUP] = str(group)
        body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        return Message(body, outgoing.token, headers)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        [outcome] = self.send_batch([(outgoing, idempotency_key)])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def send_batch(
        self, items: Sequence[tuple[Outgoing, str]]
    ) -> list[Receipt | SendRetryable | SendAmbiguous]:
        """Publish a batch through the wire (SQS: ten per call, answered per message)."""
        messages = [self._message(outgoing) for outgoing, _key in items]
        try:
            failed = self._opened().publish_batch(messages)
        except BrokerRefused as exc:
            self._forget()
            return [SendRetryable(str(exc))] * len(items)
        except BrokerUnavailable as exc:
            self._forget()
            if exc.maybe_published:
                lost = f"{exc} (its answer was lost: the broker may have taken them)"
                return [SendAmbiguous(lost)] * len(items)
            return [SendRetryable(str(exc))] * len(items)
        taken = f"published to {self.queue} by {self.name}"
        return [
            SendRetryable(f"the broker did not take it into {self.queue!r}")
            if outgoing.token in failed
            else Receipt(outgoing.token, taken)
            for outgoing, _key in items
        ]
