"""Text made safe to show: what users and providers wrote, inert on an operator's terminal, and
URLs without their passwords. Every message, log line and table that shows such text passes
through here, so an escape sequence in a job's argument cannot rewrite a screen or a clipboard,
and a password in a URL never reaches a log."""

from __future__ import annotations

import re
from urllib.parse import unquote

_MASK = "***"  # what a password is shown as
# The password of `scheme://user:password@host`: up to the last `@` before the path, which
# covers both readings of an unencoded `@` in it (libpq stops at the first, urlsplit at the last).
_URL_PASSWORD = re.compile(r"^(?P<keep>[A-Za-z][A-Za-z0-9+.-]*://[^:@/]*:)(?P<secret>[^/]*)@")
# A `password=` (or `sslpassword=`, …) query parameter of a URL.
_QUERY_PASSWORD = re.compile(r"(?P<keep>(?:^|[?&;])[^&;=#]*password[^&;=#]*=)(?P<secret>[^&;#]*)",
                             re.IGNORECASE)  # fmt: skip
# A `password = …` pair of a keyword DSN (`host=… password=…`), quoted or not.
_KEYWORD_PASSWORD = re.compile(
    r"(?P<keep>\b\w*password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE
)


def _secrets(url: str) -> list[str]:
    """Every password a URL (or keyword DSN) carries, as written and percent-decoded."""
    found = [m["secret"] for m in _URL_PASSWORD.finditer(url)]
    _, _, query = url.partition("?")
    found += [m["secret"] for m in _QUERY_PASSWORD.finditer(query)]
    if "://" not in url:
        found += [m["secret"] for m in _KEYWORD_PASSWORD.finditer(url)]
    found += [unquote(secret) for secret in found]
    return sorted({s for s in found if s and s != _MASK}, key=len, reverse=True)


def scrubbed(text: str, url: str) -> str:
    """`text` (a driver's message) with any password of `url` in it replaced by ***."""
    for secret in _secrets(url):
        text = text.replace(secret, _MASK)
    return text


def printable(text: str) -> str:
    """`text` on one line, inert on a terminal: control and other unprintable characters
    (escape sequences, line breaks, bidirectional overrides) shown as `\\x1b`, `\\n`,
    `\\u202e`, and undecodable bytes of an argument (`\\udcff`) as the byte `\\xff`."""
    return "".join(ch if ch.isprintable() else _shown(ch) for ch in text)


def _shown(ch: str) -> str:
    if "\udc80" <= ch <= "\udcff":  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{ord(ch) - 0xDC00:02x}"
    return ascii(ch)[1:-1]


def redact(url: str) -> str:
    """The URL without its passwords — in `user:password@`, and in `password=` query parameters
    (or keyword-DSN pairs) — and with unprintable characters escaped, for messages and logs.
    Works on text that is not a valid URL too."""
    if "://" not in url:
        return printable(_KEYWORD_PASSWORD.sub(r"\g<keep>***", url))
    url = _URL_PASSWORD.sub(r"\g<keep>***@", url, count=1)
    head, mark, query = url.partition("?")
    return printable(head + mark + _QUERY_PASSWORD.sub(r"\g<keep>***", query))
