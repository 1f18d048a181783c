"""A provider's delivery event, read: which message it is about and the stage it puts it in.

Events arrive as Resend sends them (Svix-signed JSON: `type`, `created_at`, `data.email_id`,
`data.tags`, `data.headers`). The message is named by the token oncebox put on every send — the
`oncebox` tag, else the `X-Oncebox-Token` header, else the `<token@domain>` Message-ID — never
by the business key, which no provider ever sees.

Stages, in the order a message moves through them (a later event never moves it back, so
duplicates and reordering are harmless):

    accepted    the provider took it (email.sent)
    delayed     delivery is being retried by the provider (email.delivery_delayed)
    delivered   the recipient's server accepted it (opened and clicked imply it)
    failed      the provider could not send it (email.failed)
    bounced     the recipient's server refused it
    complained  the recipient marked it as spam

Every stage but `failed` says the provider took the message: a held send with such an event is
settled `sent` — unless its furthest stage is `failed` (Resend reports `email.sent` for a
request it took, then `email.failed` if it could not send it). A `failed` message is left held
for a person: the provider had it and did not send it, and whether a resend is wanted is a
business decision.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from oncebox.kernel.errors import InvalidArguments
from oncebox.kernel.storable import checked_text
from oncebox.store.params import ProviderEvent

STAGES = ("accepted", "delayed", "delivered", "failed", "bounced", "complained")
HOLDING = ("failed",)  # the stage that keeps a held send held: the provider did not send it
TOOK_IT = tuple(stage for stage in STAGES if stage not in HOLDING)  # settles a held send
KINDS: dict[str, str | None] = {
    "email.sent": "accepted",
    "email.delivery_delayed": "delayed",
    "email.delivered": "delivered",
    "email.failed": "failed",
    "email.bounced": "bounced",
    "email.complained": "complained",
    "email.opened": "delivered",
    "email.clicked": "delivered",
}
TOOK_IT_KINDS = tuple(kind for kind, stage in KINDS.items() if stage in TOOK_IT)
TAG = "oncebox"
TOKEN_HEADER = "x-oncebox-token"  # noqa: S105 (a header name)
MAX_ID_CHARS = 200
_TOKEN = re.compile(r"[0-9a-f]{32}")
_MESSAGE_ID = re.compile(r"<([0-9a-f]{32})@[^<>@\s]+>")


@dataclass(frozen=True)
class Read:
    """An event as read: its stage (None: a kind oncebox does not track) and token (None: a
    message oncebox did not send)."""

    kind: str
    stage: str | None
    token: str | None
    provider_id: str | None
    occurred_at: datetime | None


def below(stage: str) -> tuple[str, ...]:
    """The stages `stage` goes further than."""
    return STAGES[: STAGES.index(stage)]


def read_event(payload: Mapping[str, Any]) -> Read:
    """What a verified payload says; `InvalidArguments` when it is not an event at all,
    `InvalidInput` when its text is none a store keeps (a NUL, a lone surrogate)."""
    kind = payload.get("type")
    data = payload.get("data")
    if not isinstance(kind, str) or not kind or len(kind) > MAX_ID_CHARS:
        raise InvalidArguments("the event has no type")
    if not isinstance(data, Mapping):
        raise InvalidArguments("the event has no data object")
    provider_id = data.get("email_id")
    provider_id = provider_id[:MAX_ID_CHARS] if isinstance(provider_id, str) else None
    checked_text(kind, "the event's type")
    if provider_id is not None:
        checked_text(provider_id, "the event's data.email_id")
    return Read(
        kind=kind,
        stage=KINDS.get(kind),
        token=token_of(data),
        provider_id=provider_id,
        occurred_at=_instant(payload.get("created_at")),
    )


def token_of(data: Mapping[str, Any]) -> str | None:
    """The oncebox token an event's message carries: the tag, the header, or the Message-ID."""
    tags = data.get("tags")
    if isinstance(tags, Mapping):
        found = tags.get(TAG)
    elif isinstance(tags, list):
        found = _named(tags, TAG)
    else:
        found = None
    if isinstance(found, str) and _TOKEN.fullmatch(found):
        return found
    headers = data.get("headers")
    values: dict[str, Any] = {}
    if isinstance(headers, Mapping):
        values = {str(name).lower(): value for name, value in headers.items()}
    elif isinstance(headers, list):
        values = {
            str(item.get("name", "")).lower(): item.get("value")
            for item in headers
            if isinstance(item, Mapping)
        }
    header = values.get(TOKEN_HEADER)
    if isinstance(header, str) and _TOKEN.fullmatch(header):
        return header
    message_id = values.get("message-id")
    if isinstance(message_id, str):
        matched = _MESSAGE_ID.fullmatch(message_id.strip())
        if matched:
            return matched.group(1)
    return None


def _named(items: list[Any], name: str) -> Any:
    for item in items:
        if isinstance(item, Mapping) and item.get("name") == name:
            return item.get("value")
    return None


def _instant(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return instant.astimezone(UTC) if instant.tzinfo is not None else None
    except (ValueError, OverflowError):  # not an instant; one past year 1 or 9999 in UTC
        return None


def provider_event(channel: str, event_id: str, read: Read) -> ProviderEvent:
    """The store's record of a read event."""
    return ProviderEvent(
        channel=channel,
        event_id=event_id[:MAX_ID_CHARS],
        kind=read.kind,
        token=read.token,
        provider_id=read.provider_id,
        occurred_at=read.occurred_at,
        stage=read.stage,
        below=below(read.stage) if read.stage else (),
        settles=read.stage in TOOK_IT,
        holding=HOLDING,
        reason=f"the provider reported it {read.kind} (event {event_id[:MAX_ID_CHARS]})",
    )


def report_figures(counters: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Per channel, how many messages its provider reported on and how many its events moved to
    each stage (once per stage; a stage passed over by a later event that arrived first is not
    counted), and the bounce and complaint rates among the messages reported on — from the
    durable counters `reports:<channel>:<stage>`."""
    figures: dict[str, dict[str, Any]] = {}
    for name, value in counters.items():
        prefix, _, rest = name.partition(":")
        if prefix != "reports" or ":" not in rest:
            continue
        channel, _, stage = rest.rpartition(":")
        figures.setdefault(channel, {"reported": 0, **dict.fromkeys(STAGES, 0)})[stage] = value
    for entry in figures.values():
        reported = entry["reported"]
        entry["bounce_rate"] = round(entry["bounced"] / reported, 6) if reported else None
        entry["complaint_rate"] = round(entry["complained"] / reported, 6) if reported else None
    return dict(sorted(figures.items()))
