"""Provider reports in tests: the signing secret and a Svix-signed request, as a provider sends
its delivery events, and a provider whose every acknowledgement is lost."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from typing import Any

from oncebox.kernel import clock
from oncebox.providers import Outgoing, Receipt, SendAmbiguous
from oncebox.providers.webhook_signatures import sign_webhook, signing_key

SECRET_ENV = "ONCEBOX_TEST_REPORTS_SECRET"
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def signed(
    payload: dict[str, Any],
    *,
    event_id: str | None = None,
    at: int | None = None,
    secret: str = SECRET,
    prefix: str = "svix",
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one signed event (`prefix` "webhook" for Standard Webhooks')."""
    body = json.dumps(payload).encode()
    event_id = event_id or f"msg_{secrets.token_hex(8)}"
    stamp = str(at if at is not None else int(clock.real_now().timestamp()))
    signature = sign_webhook(signing_key(secret), event_id, stamp, body)
    return body, {
        f"{prefix}-id": event_id,
        f"{prefix}-timestamp": stamp,
        f"{prefix}-signature": signature,
        "content-type": "application/json",
    }


class LostAcks:
    """Takes every message and never answers (a lost acknowledgement); not idempotent, so each
    unknown outcome is held. `received` is what it took: the sends a recipient would see."""

    name = "lost-acks"
    idempotent = False
    idempotency_window: timedelta | None = None

    def __init__(self) -> None:
        self.received: list[str] = []

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        self.received.append(outgoing.token)
        raise SendAmbiguous("connection lost after DATA")
