"""`amqp://…?queue=NAME`: outbox messages published to a RabbitMQ queue, each confirmed.

A handler writes `ctx.outbox.add("events", {...})`; the row commits with the claim, and the
dispatcher publishes its frozen payload (JSON) to `oncebox.NAME`, declared on first use
(`brokers/rabbitmq/wire.py`), with the row's token as the AMQP message id — stable across
attempts, so a consumer can recognise a second copy. RabbitMQ keeps no idempotency keys: a
publish whose confirm was lost with the connection is an unknown outcome (`SendAmbiguous`), held
or resent as the channel's `ambiguity` says; a broker that cannot be reached, or that refused
the message, is retried.
"""

from __future__ import annotations

import json

from oncebox.brokers.messages import Message
from oncebox.brokers.rabbitmq.wire import RabbitQueue
from oncebox.brokers.relay import BrokerRelay
from oncebox.kernel.errors import BrokerRefused, BrokerUnavailable
from oncebox.providers.base import Outgoing, Receipt, SendAmbiguous, SendRetryable


class RabbitMQProvider(BrokerRelay):
    """Publishes one message at a time, each confirmed (`send`), on a connection per dispatcher
    thread (`BrokerRelay`'s: pika's connections are one thread's each)."""

    idempotent = False
    # BrokerRelay's: its `send_batch` goes unused, as the dispatcher batches only an idempotent
    # channel's rows and RabbitMQ keeps no idempotency keys
    capabilities = BrokerRelay.capabilities

    def __init__(self, url: str) -> None:
        super().__init__(
            url,
            name="rabbitmq",
            wire=RabbitQueue,
            what="a RabbitMQ channel",
            form="amqp://HOST:5672/VHOST",
        )

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
