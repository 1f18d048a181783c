"""Writing to the outbox from a handler: `ctx.outbox.email(...)`, `ctx.outbox.add(...)`.

A handler never calls a provider. It writes outbox rows, and they commit with its claim — or not
at all. Rows are buffered in memory and inserted as one set with the rest of the batch, so a
handler that only writes outbox rows costs no extra round trip.

Keys: the first message of an intent has the intent's key; further messages of the same intent
need a `suffix` (the row's key is then `intent-key~suffix`). Suffixes are explicit, not counted,
so a retry of the handler writes the same keys whatever order it sends in.

Content freeze: the row stores the complete rendered message. Every retry and replay sends exactly
that; nothing changes a message under its key. Sending different content is a new business
operation with a new key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from oncebox.jobs.codec import has_nul
from oncebox.jobs.keys import key_problem, validate_key
from oncebox.kernel.errors import ConfigurationError, InvalidArguments
from oncebox.kernel.tracing import current_context
from oncebox.outbox.channels import Channel
from oncebox.outbox.tokens import derive_token
from oncebox.providers.base import as_payload_check, capabilities_of
from oncebox.providers.email_payload import email_payload
from oncebox.store.params import OutboxInsert

SUFFIX_SEPARATOR = "~"
# `json.dumps` with options builds an encoder per call; a payload is encoded once per message
_PAYLOAD = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True)


class OutboxWriter:
    """`ctx.outbox` for one handler run; its rows are inserted only if the handler succeeds."""

    # one per job: slots make its construction and reads cheaper
    __slots__ = ("_channels", "_intent_key", "_job_id", "_now", "_secret", "rows")

    def __init__(
        self,
        *,
        intent_key: str | None,
        job_id: int | None,
        channels: Mapping[str, Channel],
        secret: Callable[[], str],
        now: Callable[[], datetime],
    ) -> None:
        self._intent_key = intent_key
        self._job_id = job_id
        self._channels = channels
        self._secret = secret
        self._now = now
        self.rows: list[OutboxInsert] = []

    def _key(self, suffix: str | None) -> str:
        if self._intent_key is None:
            raise ConfigurationError(
                "the outbox needs a task with a key template: a keyless (at-least-once) task has "
                "no intent to tie its messages to"
            )
        key = (
            self._intent_key if suffix is None else f"{self._intent_key}{SUFFIX_SEPARATOR}{suffix}"
        )
        if suffix is not None and (not suffix or "/" in suffix or key_problem(suffix) is not None):
            raise InvalidArguments(
                f"outbox suffix {suffix!r} must be one key segment (letters, digits, - _ . : @ + =)"
            )
        validate_key(key.replace(SUFFIX_SEPARATOR, "-"))  # the same length rule as keys
        if any(row.key == key for row in self.rows):
            raise InvalidArguments(
                f"this handler already wrote a message with key {key!r}; give each further "
                "message of one intent its own suffix="
            )
        return key

    def add(self, channel: str, payload: Mapping[str, Any], *, suffix: str | None = None) -> str:
        """Write a message for `channel` (its payload is frozen as given); returns its key.
        The channel's provider checks the payload now, if it can (email providers do)."""
        provider = as_payload_check(self._channel(channel).provider)
        if provider is not None:
            provider.check_payload(payload)
        return self._add(channel, payload, suffix)

    def _channel(self, name: str) -> Channel:
        if name not in self._channels:
            known = ", ".join(sorted(self._channels)) or "none"
            raise ConfigurationError(f"no channel named {name!r} (declared: {known})")
        return self._channels[name]

    def _add(self, channel: str, payload: Mapping[str, Any], suffix: str | None) -> str:
        cap = capabilities_of(self._channel(channel).provider).max_payload_bytes
        key = self._key(suffix)
        try:
            text = _PAYLOAD.encode(dict(payload))
        except (TypeError, ValueError) as exc:
            raise InvalidArguments(f"outbox payload for {key!r} is not JSON: {exc}") from None
        if "\\u0000" in text and has_nul(payload):  # JSON writes a NUL as \u0000
            raise InvalidArguments(f"outbox payload for {key!r} contains a NUL character")
        if len(text.encode("utf-8")) > cap:  # the channel's provider's own cap
            raise InvalidArguments(f"outbox payload for {key!r} exceeds {cap} bytes")
        token = derive_token(self._secret(), key)
        self.rows.append(
            OutboxInsert(
                key, self._intent_key or key, channel, text, token, self._job_id, current_context()
            )
        )
        return key

    def email(
        self,
        *,
        to: str | Sequence[str],
        subject: str,
        text: str | None = None,
        html: str | None = None,
        headers: Mapping[str, str] | None = None,
        sender: str | None = None,
        reply_to: str | None = None,
        suffix: str | None = None,
        channel: str = "email",
    ) -> str:
        """Write an email; it is rendered now (Date included) and sent later, exactly as is."""
        configured = self._channels.get(channel)
        payload = email_payload(
            to=to,
            subject=subject,
            text=text,
            html=html,
            headers=headers,
            sender=sender or (configured.sender if configured else None),
            reply_to=reply_to,
            date=self._now(),
        )
        return self._add(channel, payload, suffix)
