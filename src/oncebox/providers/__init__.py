"""Providers: where outbox messages leave the system. `from_url` picks one.

file://DIR            one .eml per message (the embedded default; idempotent forever)
console:              print each message (development)
null:                 accept everything (benchmarks)
smtp://host:port      SMTP; credentials only inside TLS (STARTTLS, or smtps:// / port 465)
resend://             an HTTP email API with idempotency keys (resend+http://host for others)
webhook+https://host/path
                      each message's JSON payload POSTed, signed (webhook+http:// for an
                      allow-listed target)
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.extras import needs
from oncebox.kernel.inert import redact
from oncebox.providers.base import (
    Outgoing,
    Provider,
    Receipt,
    SendAmbiguous,
    SendError,
    SendPermanent,
    SendRetryable,
    SendThrottled,
    StatusLookup,
)

DEFAULT_EMAIL_URL = "file://oncebox-outbox"

__all__ = [
    "DEFAULT_EMAIL_URL",
    "Outgoing",
    "Provider",
    "Receipt",
    "SendAmbiguous",
    "SendError",
    "SendPermanent",
    "SendRetryable",
    "SendThrottled",
    "StatusLookup",
    "from_url",
]


def from_url(url: str) -> Provider:
    """The provider an `ONCEBOX_EMAIL`-style URL names; a clear error for anything else."""
    if not isinstance(url, str) or ":" not in url:
        raise ConfigurationError(f"email URL {url!r} is not a URL (e.g. smtp://127.0.0.1:2525)")
    scheme = url.split(":", 1)[0].lower()
    if scheme == "file":
        parts = urlsplit(url)
        path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
        if not path:
            raise ConfigurationError(f"email URL {url!r} names no directory")
        from oncebox.providers.local import PRIVATE_FOLDER, FileProvider  # noqa: PLC0415

        return FileProvider(Path(path), _folder_mode(url, parts.query, PRIVATE_FOLDER))
    if scheme in {"console", "null"}:
        from oncebox.providers.local import ConsoleProvider, NullProvider  # noqa: PLC0415

        return ConsoleProvider() if scheme == "console" else NullProvider()
    try:
        if scheme in {"smtp", "smtps"}:
            from oncebox.providers.smtp import SmtpProvider  # noqa: PLC0415

            return SmtpProvider(url)
        if scheme in {"amqp", "amqps"}:
            with needs("rabbitmq", "a RabbitMQ channel"):
                from oncebox.brokers.rabbitmq.relay import RabbitMQProvider  # noqa: PLC0415 (pika)

            return RabbitMQProvider(url)
        if scheme in {"resend", "resend+http", "resend+https"}:
            from oncebox.providers.http import http_provider  # noqa: PLC0415 (httpx2 lazily)

            return http_provider(url)
        if scheme in {"webhook+https", "webhook+http"}:
            from oncebox.providers.webhook import WebhookProvider  # noqa: PLC0415 (httpx2 lazily)

            return WebhookProvider(url)
    except ValueError as exc:  # an unclosed '[', a port out of range: urlsplit's own errors
        raise ConfigurationError(f"email URL {redact(url)!r} is malformed: {exc}") from None
    raise ConfigurationError(
        f"email URL scheme {scheme!r} is not supported: use file://, console:, null:, smtp://, "
        "smtps://, resend://, webhook+https:// or amqp://"
    )


def _folder_mode(url: str, query: str, default: int) -> int:
    """`?mode=0750` of a `file://` URL, in octal, the only option it takes."""
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - {"mode"})
    if unknown:
        raise ConfigurationError(f"email URL {url!r}: unknown option(s) {', '.join(unknown)}")
    text = options.get("mode")
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and set(text) <= set("01234567") and len(text) <= 4):
        raise ConfigurationError(f"email URL {url!r}: mode={text!r} is not an octal mode (0750)")
    return int(text, 8)
