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

What a provider can do beyond `send` it declares, as `capabilities = Capabilities(...)`: a batch
send, a status lookup that settles ambiguous rows, a `close`, a check of a payload when a handler
writes it, and the largest payload its channel stores. The lanes read that declaration through
`capabilities_of` and the `as_…` views below, and nowhere else ask a provider what it has: a
provider object a user hands to `box.channel(...)` that declares nothing is read here from the
methods it has, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol, cast, runtime_checkable

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


class BatchSender(Protocol):
    def send_batch(
        self, items: Sequence[tuple[Outgoing, str]]
    ) -> Sequence[Receipt | BaseException]: ...


class Closing(Protocol):
    def close(self) -> None: ...


class PayloadCheck(Protocol):
    def check_payload(self, payload: Mapping[str, Any]) -> None: ...


# What an outbox row's payload could hold, as stored JSON, before each provider declared its
# own cap: every channel had the email cap. A provider that declares none keeps it.
DEFAULT_MAX_PAYLOAD_BYTES = 10 * 1024 * 1024
ZERO = timedelta(0)


@dataclass(frozen=True)
class Capabilities:
    """What a provider can do beyond `send`; each flag names the method it promises.

    - `send_batch`: `send_batch(items)` sends many in one exchange; the dispatcher uses it for an
      idempotent channel's fresh rows (a relay's publishes, one broker transaction).
    - `lookup`: `status(outgoing, key)` says what became of a send; the resolver asks it about
      ambiguous rows, and believes a "not_found" only `lookup_lag` after the row was held.
    - `close`: `close()` lets go of the connections it holds; the box calls it when it closes.
    - `check_payload`: `check_payload(payload)` refuses, when a handler writes the row, a payload
      this provider could never send (`InvalidArguments`).
    - `max_payload_bytes`: the largest payload, as the row stores it (JSON, UTF-8), the writer
      accepts for a channel of this provider.

    Delivery reports are not here: they are a channel's option (`reports=`), received by
    `api/deliveries.py` from the service behind the provider; the provider object takes no part.
    """

    send_batch: bool = False
    lookup: bool = False
    lookup_lag: timedelta = ZERO
    close: bool = False
    check_payload: bool = False
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES


def capabilities_of(provider: object) -> Capabilities:
    """The declaration of the provider's own class; for one that declares none — a user's own
    provider, or a subclass that adds methods without restating what its class can do — what its
    methods offer, read as the lanes always read it. The one place that looks."""
    if "capabilities" in vars(type(provider)):  # a class attribute or a property of its own
        declared = getattr(provider, "capabilities", None)
        if isinstance(declared, Capabilities):
            return declared
    lookup = isinstance(provider, StatusLookup)
    return Capabilities(
        send_batch=hasattr(provider, "send_batch"),
        lookup=lookup,
        lookup_lag=getattr(provider, "lookup_lag", ZERO) if lookup else ZERO,
        close=callable(getattr(provider, "close", None)),
        check_payload=callable(getattr(provider, "check_payload", None)),
    )


def as_batch_sender(provider: object) -> BatchSender | None:
    """The provider's batch send, if it declares one."""
    return cast(BatchSender, provider) if capabilities_of(provider).send_batch else None


def as_status_lookup(provider: object) -> StatusLookup | None:
    """The provider's status lookup, if it declares one."""
    return cast(StatusLookup, provider) if capabilities_of(provider).lookup else None


def as_closing(provider: object) -> Closing | None:
    """The provider's `close`, if it declares one."""
    return cast(Closing, provider) if capabilities_of(provider).close else None


def as_payload_check(provider: object) -> PayloadCheck | None:
    """The provider's check of a payload as it is written, if it declares one."""
    return cast(PayloadCheck, provider) if capabilities_of(provider).check_payload else None


@dataclass
class ProviderInfo:
    """Describes a provider for logs and the console without exposing its secrets."""

    name: str
    idempotent: bool
    window: timedelta | None
    extra: dict[str, str] = field(default_factory=dict)
