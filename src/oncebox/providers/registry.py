"""Provider URL schemes, each to the factory that builds its provider: the one way to a provider.

Each entry names its factory as text — module path and attribute — imported with `importlib` the
first time a URL asks for it. Nothing else in oncebox imports a provider's implementation module
(`tests/test_provider_registry.py` holds that against the source), so:

- `import oncebox` loads no HTTP client, no SMTP session, no pika;
- `providers/` stays below `brokers/`: the `amqp://` provider lives in `brokers/rabbitmq/relay.py`
  and imports `providers.base`; this table names it without importing it;
- an extra a provider needs (`rabbitmq`: pika) is asked for by name, and its absence is one line
  naming the extra to install (`kernel/extras.py`), not a ModuleNotFoundError.

An entry also says what kind of channel its provider serves, so that an error names it ("SMTP
URL", "webhook URL") instead of calling every URL an email's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.extras import needs
from oncebox.kernel.inert import redact
from oncebox.providers.base import Provider


@dataclass(frozen=True)
class ProviderEntry:
    """Where the factory of a scheme's provider is, and what its errors call its channel."""

    module: str  # the module that holds the factory, imported on first use
    factory: str  # a callable there taking the URL: `(url) -> Provider`
    kind: str  # what its URLs are called in errors: "email", "webhook", "RabbitMQ"
    extra: str | None = None  # the extra of pyproject.toml its module needs, if any
    opaque: bool = False  # written `scheme:` (console:, null:), not `scheme://`

    def load(self) -> Callable[[str], Provider]:
        """The factory, its module imported now (a missing extra is `MissingExtra`)."""
        if self.extra is None:
            module = importlib.import_module(self.module)
        else:
            with needs(self.extra, f"a {self.kind} channel"):
                module = importlib.import_module(self.module)
        factory: Callable[[str], Provider] = getattr(module, self.factory)
        return factory


_LOCAL = "oncebox.providers.local"
_SMTP = ProviderEntry("oncebox.providers.smtp", "SmtpProvider", "SMTP")
_RABBITMQ = ProviderEntry(
    "oncebox.brokers.rabbitmq.relay", "RabbitMQProvider", "RabbitMQ", extra="rabbitmq"
)
_HTTP = ProviderEntry("oncebox.providers.http", "http_provider", "email API")
_WEBHOOK = ProviderEntry("oncebox.providers.webhook", "WebhookProvider", "webhook")

PROVIDERS: dict[str, ProviderEntry] = {
    "file": ProviderEntry(_LOCAL, "file_provider", "email"),
    "console": ProviderEntry(_LOCAL, "console_provider", "email", opaque=True),
    "null": ProviderEntry(_LOCAL, "null_provider", "null", opaque=True),
    "smtp": _SMTP,
    "smtps": _SMTP,
    "resend": _HTTP,
    "resend+http": _HTTP,
    "resend+https": _HTTP,
    "webhook+https": _WEBHOOK,
    "webhook+http": _WEBHOOK,
    "amqp": _RABBITMQ,
    "amqps": _RABBITMQ,
}


def schemes() -> str:
    """The schemes a provider URL may have, as people write them."""
    forms = [f"{name}:" if entry.opaque else f"{name}://" for name, entry in PROVIDERS.items()]
    return f"{', '.join(forms[:-1])} or {forms[-1]}"


def entry_for(url: str) -> ProviderEntry:
    """The entry of the URL's scheme; a ConfigurationError naming the schemes for any other."""
    if not isinstance(url, str) or ":" not in url:
        raise ConfigurationError(f"provider URL {url!r} is not a URL (e.g. smtp://127.0.0.1:2525)")
    scheme = url.split(":", 1)[0].lower()
    entry = PROVIDERS.get(scheme)
    if entry is None:
        raise ConfigurationError(
            f"provider URL scheme {scheme!r} is not supported: use {schemes()}"
        )
    return entry


def from_url(url: str) -> Provider:
    """The provider a channel's URL (`ONCEBOX_EMAIL`, `box.channel(provider=…)`) names; a clear
    error for anything else."""
    entry = entry_for(url)
    factory = entry.load()
    try:
        return factory(url)
    except ValueError as exc:  # an unclosed '[', a port out of range: urlsplit's own errors
        raise ConfigurationError(f"{entry.kind} URL {redact(url)!r} is malformed: {exc}") from None
