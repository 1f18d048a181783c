"""The relay of a queue SQS holds: a broker-held queue's jobs published to SQS (`brokers/sqs.py`).

Like RabbitMQ's relay (`providers/rabbitmq.py`, `RabbitMQRelay`), its receiver keeps the key —
the consumer runs only the copy whose job still waits at the attempt it carries — so it is
idempotent with no window: a batch whose answer was lost is sent again, and the dispatcher
records a batch of publishes together. SQS answers per message: one it did not take is retried.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import timedelta
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from oncebox.brokers.messages import Message
from oncebox.brokers.sqs import GROUP, SqsQueue
from oncebox.errors import BrokerRefused, BrokerUnavailable, ConfigurationError
from oncebox.providers.base import Outgoing, Receipt, SendAmbiguous, SendRetryable


class SqsRelay:
    name = "sqs-relay"
    idempotent = True
    idempotency_window: timedelta | None = None

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        query = parse_qsl(parts.query)
        queues = [value for name, value in query if name == "queue"]
        if len(queues) != 1 or not queues[0]:
            raise ConfigurationError("an SQS relay names its queue: sqs://REGION?queue=NAME")
        self.queue = queues[0]
        rest = urlencode([(name, value) for name, value in query if name != "queue"])
        self.url = urlunsplit(parts._replace(query=rest))
        self._local = threading.local()  # a boto3 client per dispatcher thread
        self._open: set[SqsQueue] = set()
        self._open_lock = threading.Lock()

    def _opened(self) -> SqsQueue:
        queue: SqsQueue | None = getattr(self._local, "queue", None)
        if queue is None:
            queue = SqsQueue(self.url, self.queue)
            with self._open_lock:
                self._open.add(queue)
            self._local.queue = queue
            queue.declare()
        return queue

    def _forget(self) -> None:
        queue: SqsQueue | None = getattr(self._local, "queue", None)
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
        """Send a batch (SQS takes ten per call; it answers per message)."""
        messages = [self._message(outgoing) for outgoing, _key in items]
        try:
            failed = self._opened().publish_batch(messages)
        except BrokerRefused as exc:
            self._forget()
            return [SendRetryable(str(exc))] * len(items)
        except BrokerUnavailable as exc:
            self._forget()
            if exc.maybe_published:
                lost = f"{exc} (its answer was lost: SQS may have taken them)"
                return [SendAmbiguous(lost)] * len(items)
            return [SendRetryable(str(exc))] * len(items)
        taken = f"sent to SQS queue {self.queue}"
        return [
            SendRetryable(f"SQS did not take it into {self.queue!r}")
            if outgoing.token in failed
            else Receipt(outgoing.token, taken)
            for outgoing, _key in items
        ]
