"""Providers: where outbox messages leave the system. `from_url` picks one (`registry.py`).

file://DIR            one .eml per message (the embedded default; idempotent forever)
console:              print each message (development)
null:                 accept everything (benchmarks)
smtp://host:port      SMTP; credentials only inside TLS (STARTTLS, or smtps:// / port 465)
resend://             an HTTP email API with idempotency keys (resend+http://host for others)
webhook+https://host/path
                      each message's JSON payload POSTed, signed (webhook+http:// for an
                      allow-listed target)
amqp://host/vhost?queue=NAME
                      each message published to a RabbitMQ queue (`brokers/rabbitmq/relay.py`)

What each can do beyond `send` it declares (`Capabilities`, `base.py`).
"""

from __future__ import annotations

from oncebox.providers.base import (
    Capabilities,
    Outgoing,
    Provider,
    Receipt,
    SendAmbiguous,
    SendError,
    SendPermanent,
    SendRetryable,
    SendThrottled,
    StatusLookup,
)
from oncebox.providers.registry import from_url

DEFAULT_EMAIL_URL = "file://oncebox-outbox"

__all__ = [
    "DEFAULT_EMAIL_URL",
    "Capabilities",
    "Outgoing",
    "Provider",
    "Receipt",
    "SendAmbiguous",
    "SendError",
    "SendPermanent",
    "SendRetryable",
    "SendThrottled",
    "StatusLookup",
    "from_url",
]
