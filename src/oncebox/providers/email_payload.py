"""Email payloads: what `ctx.outbox.email(...)` writes and an email provider accepts, validated
when a handler writes them.

The outbox row stores the payload (recipients, subject, bodies, headers, the Date it was written
at). This is the format both sides share — the writer above, the email providers below — and no
provider: rendering it to MIME is `email.py`'s, for the providers alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.headerregistry import Address
from email.utils import format_datetime, getaddresses, parseaddr
from functools import lru_cache
from typing import Any

from oncebox.kernel.errors import InvalidArguments

RESERVED_HEADERS = frozenset({"message-id", "x-oncebox-token", "from", "to", "subject", "date"})
# What Python's email package (as `str.splitlines`) takes for the end of a line: in a header it
# would end the header, so rendering refuses it. Refused when written, not when sent.
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _one_line(value: object) -> bool:
    return isinstance(value, str) and not any(char in LINE_BREAKS for char in value)


def _breaks(value: str) -> str:
    found = sorted({f"U+{ord(char):04X}" for char in value if char in LINE_BREAKS})
    return f" (it holds {', '.join(found)}, a line break to email)" if found else ""


# The largest email payload a channel stores (as JSON): what the email providers declare.
MAX_EMAIL_BYTES = 10 * 1024 * 1024


# A plain `local@domain` (the common case) is checked with this; anything else (display names,
# quoted local parts) goes through the standard library's parser.
_PLAIN_ADDRESS = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+"
)


def _address(value: str, field: str) -> str:
    if isinstance(value, str) and _PLAIN_ADDRESS.fullmatch(value):
        return value
    return _parsed_address(value, field)


@lru_cache(maxsize=4096)
def _parsed_address(value: str, field: str) -> str:
    if not _one_line(value):
        raise InvalidArguments(f"email {field} {value!r} is not an address")
    if not value.isascii():
        raise InvalidArguments(
            f"email {field} {value!r} is not ASCII; internationalised addresses (SMTPUTF8) are "
            "not supported"
        )
    parsed = getaddresses([value])
    if len(parsed) != 1:
        if all(_PLAIN_ADDRESS.fullmatch(address) for _name, address in parsed):
            raise InvalidArguments(f"email {field} {value!r} holds several addresses; pass a list")
        raise InvalidArguments(f"email {field} {value!r} is not an address")
    _name, address = parseaddr(value)
    if "@" not in address or address.startswith("@") or address.endswith("@"):
        raise InvalidArguments(f"email {field} {value!r} is not an address")
    try:
        Address(addr_spec=address)
    except (ValueError, IndexError) as exc:
        raise InvalidArguments(f"email {field} {value!r} is not an address: {exc}") from None
    return value


@lru_cache(maxsize=64)
def _date_header(date: datetime, _offset: timedelta | None) -> str:
    """A batch's handlers write their messages at one instant (the lease's), so the Date header
    is formatted once per batch, not per message (it was a third of a digest handler's time).
    The offset is part of the cache key: equal instants in two zones are equal datetimes."""
    return format_datetime(date)


def email_payload(
    *,
    to: str | Sequence[str],
    subject: str,
    text: str | None,
    html: str | None,
    headers: Mapping[str, str] | None,
    sender: str | None,
    reply_to: str | None,
    date: datetime,
) -> dict[str, Any]:
    """A checked email payload; raises `InvalidArguments` naming what is wrong."""
    recipients = [to] if isinstance(to, str) else list(to)
    if not recipients:
        raise InvalidArguments("an email needs at least one recipient")
    if not _one_line(subject):
        raise InvalidArguments(
            "the email subject must be one line of text"
            + (_breaks(subject) if isinstance(subject, str) else "")
        )
    if text is None and html is None:
        raise InvalidArguments("an email needs a text or an html body")
    clean_headers: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not name.isascii() or not name.replace("-", "").isalnum():
            raise InvalidArguments(f"email header name {name!r} is not a header name")
        if name.lower() in RESERVED_HEADERS:
            raise InvalidArguments(f"email header {name!r} is set by oncebox or by a parameter")
        if not _one_line(value):
            raise InvalidArguments(
                f"email header {name!r} must be one line of text"
                + (_breaks(value) if isinstance(value, str) else "")
            )
        clean_headers[name] = value
    payload: dict[str, Any] = {
        "to": [_address(r, "recipient") for r in recipients],
        "subject": subject,
        "text": text,
        "html": html,
        "headers": clean_headers,
        "from": _address(sender, "sender") if sender else None,
        "reply_to": _address(reply_to, "reply-to") if reply_to else None,
        "date": _date_header(date, date.utcoffset()),
    }
    return payload


def check_email_payload(payload: Mapping[str, Any]) -> None:
    """The checks `email_payload` made, for a payload written with `ctx.outbox.add(...)` on an
    email channel (or read back from a row): `InvalidArguments` if it cannot be sent as email."""
    if not isinstance(payload, Mapping):
        raise InvalidArguments("an email payload is a mapping")
    email_payload(
        to=payload.get("to") or [],
        subject=payload.get("subject"),  # type: ignore[arg-type]
        text=payload.get("text"),
        html=payload.get("html"),
        headers=payload.get("headers"),
        sender=payload.get("from"),
        reply_to=payload.get("reply_to"),
        date=datetime(1970, 1, 1, tzinfo=UTC),
    )
    if not isinstance(payload.get("date"), str):
        raise InvalidArguments("an email payload needs its Date (as written by ctx.outbox.email)")
