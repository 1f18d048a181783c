"""The provider interface: one method, `send(outgoing, idempotency_key) -> Receipt`.

A provider says whether it honours an idempotency key, and for how long (`idempotency_window`;
None means forever, as for the file sink). It reports the outcome of a send by returning a
`Receipt`, or by raising one of four errors — the classification the dispatcher acts on:

    SendError
    ├── SendRetryable   not delivered; try again later (connection refused, 5xx, 408, 425, SMTP 4xx)
    ├── SendThrottled   not delivered; pause the whole channel (HTTP 429 + Retry-After, SMTP 421)
    ├── SendPermanent   not delivered and never will be (HTTP 400/422, SMTP 5xx); `alarm` when
    │                   the provider saw this key with a different body
    └── SendAmbiguous   may have been delivered (timeout after the request was written, connection
                        lost after SMTP DATA)

An optional `status(idempotency_key, outgoing)` lets the ambiguity resolver settle ambiguous rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol, runtime_checkable

StatusAnswer = Literal["sent", "not_found", "unknown"]


@dataclass(frozen=True)
class Outgoing:
    """One message to send: the frozen payload of an outbox row and its derived identity."""

    outbox_id: int
    channel: str
    token: str
    payload: dict[str, Any]
    attempt: int

    @property
    def message_id(self) -> str:
        """`<token@domain>`: stable across attempts, unguessable, no business key inside."""
        sender = str(self.payload.get("from") or "")
        domain = sender.rpartition("@")[2].strip("> ") or "oncebox.invalid"
        return f"<{self.token}@{domain}>"


@dataclass(frozen=True)
class Receipt:
    """What the provider said when it accepted the message (its id, if it gave one)."""

    provider_id: str | None
    detail: str = ""


class SendError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SendRetryable(SendError):
    def __init__(self, reason: str, retry_after: timedelta | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class SendThrottled(SendError):
    """`retry_after` None means the provider gave no usable delay: the channel applies its
    default pause (`pause_on_421` for SMTP's 421, `smtp_421=True`; else `default_throttle`)."""

    def __init__(
        self, reason: str, retry_after: timedelta | None = None, *, smtp_421: bool = False
    ) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.smtp_421 = smtp_421


class SendPermanent(SendError):
    def __init__(self, reason: str, alarm: bool = False) -> None:
        super().__init__(reason)
        self.alarm = alarm


class SendAmbiguous(SendError):
    pass


class Provider(Protocol):
    name: str
    idempotent: bool
    idempotency_window: timedelta | None

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt: ...


@runtime_checkable
class StatusLookup(Protocol):
    def status(
        self, outgoing: Outgoing, idempotency_key: str
    ) -> tuple[StatusAnswer, Receipt | None]: ...


@dataclass
class ProviderInfo:
    """Describes a provider for logs and the console without exposing its secrets."""

    name: str
    idempotent: bool
    window: timedelta | None
    extra: dict[str, str] = field(default_factory=dict)
