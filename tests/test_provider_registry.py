"""A provider is reached through the registry, and says what it can do instead of being probed.

- every scheme resolves, through `providers/registry.py`, to its factory; any other scheme is
  refused naming them all, and an error names the channel's kind, not "email" for every URL;
- every provider oncebox ships declares `Capabilities` that match the methods it really has, and
  the cap it declares is the one its channel's writer applies (for each of them today's 10 MiB);
- a provider a user hands in that declares nothing — or whose class inherits a declaration it
  does not restate — is read from its methods, as before;
- the source's rules (no module but the registry imports a provider implementation; no module
  but `providers/base.py` asks a provider what it can do) are the layout test's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import oncebox
from oncebox.brokers.rabbitmq.relay import RabbitMQProvider
from oncebox.brokers.relay import BrokerRelay
from oncebox.chaos.recording import RecordingProvider
from oncebox.examples.logistics.faults import FaultyFileSink
from oncebox.kernel.errors import ConfigurationError, InvalidArguments
from oncebox.outbox.channels import make_channel
from oncebox.outbox.writer import OutboxWriter
from oncebox.providers import Capabilities, Outgoing, Provider, Receipt, from_url
from oncebox.providers.base import DEFAULT_MAX_PAYLOAD_BYTES, capabilities_of
from oncebox.providers.email_payload import MAX_EMAIL_BYTES
from oncebox.providers.http import HttpEmailProvider, SearchableHttpEmailProvider, http_provider
from oncebox.providers.local import (
    ConsoleProvider,
    FileProvider,
    NullProvider,
    console_provider,
    file_provider,
    null_provider,
)
from oncebox.providers.registry import PROVIDERS
from oncebox.providers.smtp import SmtpProvider
from oncebox.providers.webhook import WebhookProvider
from oncebox.testing import MemoryProvider

PACKAGE = Path(oncebox.__file__).parent
REGISTRY = "providers/registry.py"
THE_ONE_PLACE = "providers/base.py"  # `capabilities_of`: the declaration, or the methods

FACTORIES: dict[str, Any] = {
    "file": file_provider,
    "console": console_provider,
    "null": null_provider,
    "smtp": SmtpProvider,
    "smtps": SmtpProvider,
    "resend": http_provider,
    "resend+http": http_provider,
    "resend+https": http_provider,
    "webhook+https": WebhookProvider,
    "webhook+http": WebhookProvider,
    "amqp": RabbitMQProvider,
    "amqps": RabbitMQProvider,
}

EXAMPLES: list[tuple[str, type]] = [
    ("file://outbox-dir", FileProvider),
    ("console:", ConsoleProvider),
    ("null:", NullProvider),
    ("smtp://127.0.0.1:2525", SmtpProvider),
    ("smtps://mailer:secret@mail.example:465", SmtpProvider),
    ("resend://", HttpEmailProvider),
    ("resend+http://127.0.0.1:8025", HttpEmailProvider),
    ("resend+https://mail.example?lookup=message_id", SearchableHttpEmailProvider),
    ("webhook+https://hooks.acme.example/in", WebhookProvider),
    ("webhook+http://10.0.0.5/in?allow=10.0.0.0/8", WebhookProvider),
    ("amqp://127.0.0.1:5672/%2F?queue=events", RabbitMQProvider),
    ("amqps://broker.example/%2F?queue=events", RabbitMQProvider),
]


def test_the_registry_holds_every_scheme_and_nothing_else():
    assert sorted(PROVIDERS) == sorted(FACTORIES)


@pytest.mark.parametrize("scheme", sorted(FACTORIES))
def test_each_scheme_resolves_to_its_factory(scheme):
    assert PROVIDERS[scheme].load() is FACTORIES[scheme]


@pytest.mark.parametrize(("url", "kind"), EXAMPLES, ids=[url for url, _ in EXAMPLES])
def test_from_url_builds_the_provider_its_scheme_names(url, kind):
    provider = from_url(url)
    assert type(provider) is kind, (url, type(provider))


def test_an_unknown_scheme_is_refused_naming_every_scheme():
    with pytest.raises(ConfigurationError) as caught:
        from_url("carrier-pigeon://loft")
    message = str(caught.value)
    assert message.startswith("provider URL scheme 'carrier-pigeon' is not supported"), message
    for scheme, entry in PROVIDERS.items():
        assert (f"{scheme}:" if entry.opaque else f"{scheme}://") in message, (scheme, message)


@pytest.mark.parametrize(
    ("url", "start"),
    [
        ("smtp://127.0.0.1:99999", "SMTP URL "),
        ("resend+http://[127.0.0.1/", "email API URL "),
        ("amqp://u:pw-secret@[127.0.0.1/%2F?queue=q", "RabbitMQ URL "),
    ],
)
def test_a_malformed_url_is_named_by_its_channels_kind_not_as_email(url, start):
    with pytest.raises(ConfigurationError) as caught:
        from_url(url)
    assert str(caught.value).startswith(start), str(caught.value)
    assert "is malformed" in str(caught.value) and "pw-secret" not in str(caught.value)


# -- declared capabilities -------------------------------------------------------------------


def shipped() -> list[tuple[str, Any]]:
    """One of every provider oncebox ships, as a channel would hold it."""
    found = [(url, from_url(url)) for url, _kind in EXAMPLES]
    relay = BrokerRelay("amqp://127.0.0.1/%2F?queue=q", name="relay", wire=lambda url, q: None)
    memory = MemoryProvider()
    return [
        *found,
        ("BrokerRelay", relay),
        ("MemoryProvider", memory),
        ("RecordingProvider", RecordingProvider(memory, history=None)),  # type: ignore[arg-type]
        ("FaultyFileSink", FaultyFileSink(from_url("file://x"), 0, set())),
    ]


def has(provider: object, method: str) -> bool:
    return callable(getattr(provider, method, None))


@pytest.mark.parametrize(("name", "provider"), shipped(), ids=[name for name, _ in shipped()])
def test_each_provider_declares_exactly_the_methods_it_has(name, provider):
    assert "capabilities" in vars(type(provider)), f"{name}'s class declares no Capabilities"
    declared = capabilities_of(provider)
    assert declared == getattr(provider, "capabilities", None), name
    has_them = {
        "send_batch": has(provider, "send_batch"),
        "lookup": has(provider, "status"),
        "close": has(provider, "close"),
        "check_payload": has(provider, "check_payload"),
    }
    says = {flag: getattr(declared, flag) for flag in has_them}
    assert says == has_them, name


@pytest.mark.parametrize(("name", "provider"), shipped(), ids=[name for name, _ in shipped()])
def test_each_provider_keeps_the_payload_cap_its_channel_had(name, provider):
    """Email providers declare the email cap, the others the default: today both are 10 MiB."""
    cap = capabilities_of(provider).max_payload_bytes
    emails = (FileProvider, ConsoleProvider, SmtpProvider, HttpEmailProvider)
    assert cap == (MAX_EMAIL_BYTES if isinstance(provider, emails) else DEFAULT_MAX_PAYLOAD_BYTES)
    assert cap == 10 * 1024 * 1024, name


def test_a_searchable_email_api_declares_the_lag_its_url_gives():
    provider = from_url("resend://?lookup=message_id&lookup_lag_s=600")
    assert capabilities_of(provider).lookup and (
        capabilities_of(provider).lookup_lag == timedelta(seconds=600)
    )
    assert not capabilities_of(from_url("resend://?lookup_lag_s=600")).lookup


class Everything:
    """A user's provider that declares nothing and has every optional method."""

    name = "everything"
    idempotent = True
    idempotency_window: timedelta | None = None
    lookup_lag = timedelta(minutes=7)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        return Receipt(None)

    def send_batch(self, items: Any) -> list[Receipt]:
        return []

    def status(self, outgoing: Outgoing, idempotency_key: str) -> tuple[str, Receipt | None]:
        return "unknown", None

    def close(self) -> None:
        pass

    def check_payload(self, payload: Any) -> None:
        pass


class Bare:
    name = "bare"
    idempotent = False
    idempotency_window: timedelta | None = None

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        return Receipt(None)


def test_a_provider_that_declares_nothing_is_read_from_its_methods():
    assert capabilities_of(Everything()) == Capabilities(
        send_batch=True,
        lookup=True,
        lookup_lag=timedelta(minutes=7),
        close=True,
        check_payload=True,
        max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES,
    )
    assert capabilities_of(Bare()) == Capabilities()


class Searchable(MemoryProvider):
    """A user's subclass of a provider that declares: it adds a lookup, and says nothing."""

    def status(self, outgoing: Outgoing, idempotency_key: str) -> tuple[str, Receipt | None]:
        return "unknown", None


def test_a_subclass_that_restates_nothing_is_read_from_its_methods():
    assert capabilities_of(MemoryProvider()) == Capabilities()
    assert capabilities_of(Searchable()) == Capabilities(lookup=True)


class Small(Bare):
    capabilities = Capabilities(max_payload_bytes=100)


def writer_for(provider: Provider) -> OutboxWriter:
    return OutboxWriter(
        intent_key="report/1",
        job_id=None,
        channels={"events": make_channel("events", provider)},
        secret=lambda: "s" * 32,
        now=lambda: datetime(2026, 8, 17, tzinfo=UTC),
    )


def test_a_channels_payload_cap_is_its_providers():
    payload = {"pad": "x" * 120}
    with pytest.raises(InvalidArguments, match="exceeds 100 bytes"):
        writer_for(Small()).add("events", payload)
    assert writer_for(Bare()).add("events", payload) == "report/1"
