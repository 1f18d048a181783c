"""Replies from outside read with a cap: at most `MAX_REPLY_BYTES` (16 KiB) of each, counted after
decompression, and never the rest — the connection is closed instead.

A provider's reply is untrusted input that arrives in the dispatcher's memory: read whole, a
199 KiB gzip reply expanded to 403 MiB. Real answers to a send or to a search by Message-ID are a
few hundred bytes. httpx2 decodes `Content-Encoding` in pieces of at most 1 MiB, so reading up to
the cap through `iter_bytes` holds about that much at once, whatever the reply expands to.

What a caller makes of a reply that went past the cap (or could not be decoded) is the same as
for a body that cannot be parsed: the status still classifies a send (a 2xx is a receipt, without
an id), and a lookup cannot learn anything from it ("unknown", never "not found"). The SMTP
provider caps each reply the same (`providers/smtp.py`).

A reply's `Retry-After` is read here too (`parse_retry_after`), for every HTTP provider alike.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from datetime import UTC, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING

from oncebox.kernel import clock

if TYPE_CHECKING:  # the SMTP provider needs only the cap, not the HTTP client
    import httpx2

MAX_REPLY_BYTES = 16 * 1024
CAP = f"{MAX_REPLY_BYTES // 1024} KiB"


@dataclass(frozen=True)
class Reply:
    """A reply's body as read: at most MAX_REPLY_BYTES, decoded. `refused` says why it is not
    the whole body (too long, not decodable); None when it is."""

    body: bytes
    refused: str | None = None


def read_reply(response: httpx2.Response) -> Reply:
    """At most MAX_REPLY_BYTES of a streamed response's decoded body. A transport error while
    reading propagates: what a broken reply means is the caller's to say."""
    import httpx2  # noqa: PLC0415 (loaded already by whoever made the response)

    read = bytearray()
    try:
        for piece in response.iter_bytes():
            read += piece[: MAX_REPLY_BYTES + 1 - len(read)]
            if len(read) > MAX_REPLY_BYTES:
                return Reply(bytes(read[:MAX_REPLY_BYTES]), f"a reply over {CAP}, not read past it")
    except httpx2.DecodingError as exc:
        return Reply(bytes(read), f"a reply that cannot be decoded ({exc})")
    return Reply(bytes(read))


def parse_retry_after(value: str | None, date_header: str | None = None) -> timedelta | None:
    """`Retry-After` as seconds or an HTTP-date; None when absent or unusable (the caller then
    applies its default pause). Negative values and dates in the past mean "now"."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text.split(",")[0])  # duplicated headers arrive joined: "30, 30"
    except ValueError:
        if text.count("GMT,") >= 1:  # two HTTP-dates joined: the first one counts
            text = text.split("GMT,")[0] + "GMT"
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        reference = clock.real_now()
        if date_header:
            with contextlib.suppress(TypeError, ValueError, IndexError):
                reference = parsedate_to_datetime(date_header)
                if reference.tzinfo is None:  # "-0000": UTC by RFC 5322's reading
                    reference = reference.replace(tzinfo=UTC)
        return max(when - reference, timedelta(0))
    if not math.isfinite(seconds):
        return None
    return timedelta(seconds=max(seconds, 0.0)) if seconds < 1e9 else timedelta(days=36500)
