"""What travels through a broker, whichever it is: a message, and a message handed to a consumer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# SQS's cap per message (body and attributes), and per batch: here, without boto3, for an enqueue
# to refuse early what the relay could never publish
SQS_MAX_MESSAGE_BYTES = 1_048_576


@dataclass(frozen=True)
class Message:
    body: bytes
    message_id: str
    headers: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    """A message handed to this consumer, unacknowledged until `ack`, `retry` or `dead`."""

    message: Message
    tag: (
        int | str
    )  # the broker's handle on this delivery (RabbitMQ: a delivery tag; SQS: a receipt)
    redelivered: bool
    channel: int = 0  # which of this queue's channels it came on: a tag means nothing elsewhere


@dataclass(frozen=True)
class GivenUp:
    """A message its broker stopped delivering: delivered `deliveries` times and never settled
    (its consumers died, or held it past their lease, every time). It waits where only oncebox's
    sweep reads it (`handle`: the broker's own, until `Wire.bury`)."""

    message: Message
    deliveries: int
    handle: Any
