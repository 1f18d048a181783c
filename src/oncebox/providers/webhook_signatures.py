"""Webhook signatures, both sides: the body a payload becomes, its signature, and how a receiver
checks one.

Standard Webhooks' scheme (https://www.standardwebhooks.com): three headers,

    webhook-id          the message's id, the same on every attempt (receivers dedupe on it)
    webhook-timestamp   when this attempt was signed, in Unix seconds
    webhook-signature   `v1,<base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`, several
                        space-separated while a secret rotates

(Svix, which Resend and others send their webhooks with, names them `svix-id`, `svix-timestamp`
and `svix-signature`: `verify_webhook` reads either set)

and a secret that is either `whsec_<base64>` (the key is the decoded bytes, as the scheme's
libraries make them) or any other text of 16 or more bytes (the key is its UTF-8 bytes). This
module needs no HTTP client: a receiver imports `verify_webhook` from here (or from
`oncebox.providers.webhook`, which re-exports it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from oncebox.kernel import clock
from oncebox.kernel.errors import ConfigurationError, InvalidArguments, OnceboxError

MAX_WEBHOOK_BYTES = 256 * 1024
MIN_KEY_BYTES = 16
DEFAULT_TOLERANCE = timedelta(minutes=5)


class WebhookRefused(OnceboxError):
    """`verify_webhook` refused a request; `reason` says why, and holds no secret."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnreadableBody(WebhookRefused):
    """The signature verified, but the body is not a JSON object: the sender's own request, which
    sending again would not change (a receiver may acknowledge it so it is not retried)."""


def signing_key(secret: str) -> bytes:
    """The HMAC key of a secret: a `whsec_` secret's base64-decoded bytes, else its UTF-8 bytes."""
    if secret.startswith("whsec_"):
        try:
            key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError("a whsec_ secret must be base64 after its prefix") from None
    else:
        key = secret.encode("utf-8", "surrogateescape")
    if len(key) < MIN_KEY_BYTES:
        raise ConfigurationError(
            f"the webhook secret is {len(key)} bytes; use at least {MIN_KEY_BYTES} random bytes"
        )
    return key


def sign_webhook(key: bytes, webhook_id: str, timestamp: str, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{webhook_id}.{timestamp}.{body}">` under `key`."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def verify_webhook(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: timedelta = DEFAULT_TOLERANCE,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A receiver's check of one request: the payload, if `webhook-signature` holds a `v1`
    signature of this body by `secret` and `webhook-timestamp` is within `tolerance` of `now`
    (the host's clock); else `WebhookRefused`. Header names in any case; `body` is the raw bytes
    received. Receivers that dedupe do it on `webhook-id`, after this check."""
    key = signing_key(secret)
    webhook_id, stamp, signatures = webhook_headers(headers)
    if not (webhook_id and stamp and signatures):
        raise WebhookRefused("missing webhook-id, webhook-timestamp or webhook-signature")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        raise WebhookRefused("webhook-timestamp is not a number of Unix seconds")
    drift = (now or clock.real_now()).timestamp() - int(stamp)
    if abs(drift) > tolerance.total_seconds():
        when = "old" if drift > 0 else "in the future"
        raise WebhookRefused(
            f"webhook-timestamp is {abs(drift):.0f} s {when}, beyond the tolerance of "
            f"{tolerance.total_seconds():.0f} s (a replay, or a skewed clock)"
        )
    expected = sign_webhook(key, webhook_id, stamp, body).encode()
    offered = [s.encode("utf-8", "surrogateescape") for s in signatures.split()]
    if not any(hmac.compare_digest(expected, candidate) for candidate in offered):
        raise WebhookRefused("no v1 signature matches this body and timestamp under the secret")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        payload = None
    if not isinstance(payload, dict):
        raise UnreadableBody("the body is not a JSON object")
    return payload


def webhook_headers(headers: Mapping[str, str]) -> tuple[str, str, str]:
    """The id, timestamp and signatures of a request, from the `webhook-*` headers or Svix's
    `svix-*` ones (the same scheme, as Resend and other Svix users send it)."""
    found = {name.lower(): value for name, value in headers.items()}
    prefix = "webhook-" if "webhook-id" in found else "svix-"
    return (
        found.get(f"{prefix}id", ""),
        found.get(f"{prefix}timestamp", ""),
        found.get(f"{prefix}signature", ""),
    )


def webhook_body(payload: Mapping[str, Any]) -> bytes:
    """A payload's request body (compact JSON, keys sorted, UTF-8); `InvalidArguments` when it
    is not a JSON object or exceeds MAX_WEBHOOK_BYTES."""
    if not isinstance(payload, Mapping):
        raise InvalidArguments("a webhook payload is a JSON object (a mapping)")
    try:
        text = json.dumps(
            dict(payload),
            ensure_ascii=False,
            allow_nan=False,
            sort_keys=True,
            separators=(",", ":"),
        )
        body = text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidArguments(f"a webhook payload must be JSON: {exc}") from None
    if len(body) > MAX_WEBHOOK_BYTES:
        raise InvalidArguments(
            f"a webhook payload is at most {MAX_WEBHOOK_BYTES} bytes as JSON; this one is "
            f"{len(body)} (send a reference, not the data)"
        )
    return body
