"""The fakes forget, as the services they stand for do: an idempotency key is honoured within
its window and forgotten after it, so a resend past the window is delivered again — the
duplicate that oncebox's window rule (hold `ambiguous` instead of resending) exists to prevent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oncebox.fakes.email_api import FakeEmailApi
from oncebox.providers import Outgoing, from_url
from oncebox.providers.email_payload import email_payload
from oncebox.testing import MemoryProvider

PAYLOAD = email_payload(
    to="c@y.example",
    subject="s",
    text="t",
    html=None,
    headers=None,
    sender="d@x.example",
    reply_to=None,
    date=datetime(2026, 8, 17, 9, tzinfo=UTC),
)


class Ticks:
    """The outside world's clock, moved by the test (no sleeping)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def outgoing(attempt: int) -> Outgoing:
    return Outgoing(1, "email", "tok-1", dict(PAYLOAD), attempt)


def test_the_fake_email_api_replays_within_its_window_and_forgets_after_it():
    ticks = Ticks()
    with FakeEmailApi(window=timedelta(seconds=60), now=ticks) as api:
        provider = from_url(api.url)
        first = provider.send(outgoing(1), "key-1")
        ticks.now = 59.0
        assert provider.send(outgoing(2), "key-1").provider_id == first.provider_id
        assert len(api.delivered) == 1
        ticks.now = 60.0
        second = provider.send(outgoing(3), "key-1")
        provider.close()  # type: ignore[attr-defined]
        assert second.provider_id != first.provider_id
        assert [d.idempotency_key for d in api.delivered] == ["key-1", "key-1"]


def test_the_fake_email_api_remembers_for_24_hours_by_default():
    ticks = Ticks()
    with FakeEmailApi(now=ticks) as api:
        provider = from_url(api.url)
        provider.send(outgoing(1), "key-1")
        ticks.now = 24 * 3600 - 1
        provider.send(outgoing(2), "key-1")
        assert len(api.delivered) == 1
        ticks.now = 24 * 3600
        provider.send(outgoing(3), "key-1")
        provider.close()  # type: ignore[attr-defined]
        assert len(api.delivered) == 2


@pytest.mark.parametrize(
    ("window", "later", "deliveries"), [(60, 59, 1), (60, 61, 2), (None, 1e9, 1)]
)
def test_the_memory_provider_forgets_a_key_after_its_window(window, later, deliveries):
    ticks = Ticks()
    provider = MemoryProvider(
        window=None if window is None else timedelta(seconds=window), now=ticks
    )
    first = provider.send(outgoing(1), "key-1")
    ticks.now = later
    again = provider.send(outgoing(2), "key-1")
    assert len(provider.deliveries) == len(provider.messages()) == deliveries
    assert (again == first) == (deliveries == 1)
