"""Email rendered the same way on every attempt, for the email providers.

Rendering an outbox row's payload (`email_payload.py`) to MIME adds only what derives from the
row's token — `Message-ID` and `X-Oncebox-Token` — so every attempt sends the same bytes apart
from transport framing.
"""

from __future__ import annotations

from email.message import EmailMessage
from email.policy import SMTP

from oncebox.kernel.errors import InvalidArguments
from oncebox.providers.base import Outgoing, SendPermanent
from oncebox.providers.email_payload import check_email_payload


def render(outgoing: Outgoing) -> EmailMessage:
    """The MIME message for an outbox row (same bytes on every attempt but transport framing).
    A payload that cannot be rendered is `SendPermanent`: nothing was sent, nothing ever will."""
    try:
        check_email_payload(outgoing.payload)
        return _render(outgoing)
    except (InvalidArguments, KeyError, TypeError, ValueError) as exc:
        raise SendPermanent(f"the message cannot be rendered as email: {exc}") from None


def _render(outgoing: Outgoing) -> EmailMessage:
    payload = outgoing.payload
    message = EmailMessage(policy=SMTP)
    message["From"] = payload.get("from") or "oncebox@localhost"
    message["To"] = ", ".join(payload["to"])
    message["Subject"] = payload["subject"]
    message["Date"] = payload["date"]
    message["Message-ID"] = outgoing.message_id
    message["X-Oncebox-Token"] = outgoing.token
    if payload.get("reply_to"):
        message["Reply-To"] = payload["reply_to"]
    for name, value in payload.get("headers", {}).items():
        message[name] = value
    if payload.get("text") is not None:
        message.set_content(payload["text"])
        if payload.get("html") is not None:
            message.add_alternative(payload["html"], subtype="html")
    else:
        message.set_content(payload["html"], subtype="html")
    return message
