"""A dispatcher SIGKILLed between the provider's acceptance and the record of it: never silently
dropped — held as ambiguous on SMTP (policy hold), resent and deduplicated on an idempotent API."""

from __future__ import annotations

import multiprocessing
import signal
from datetime import UTC, datetime, timedelta

import pytest

from oncebox.fakes.email_api import FakeEmailApi
from oncebox.fakes.smtp_sink import SmtpSink
from oncebox.outbox.tokens import derive_token
from oncebox.testing import FrozenClock, drain
from support.outbox import SECRET, enqueue_customers
from support.procs import dispatch_and_die

SPAWN = multiprocessing.get_context("spawn")
T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
KEY = "weekly-digest/customer-1/2026-W33"
pytestmark = pytest.mark.slow


def kill_dispatcher_at(url: str, provider: str, point: str) -> None:
    process = SPAWN.Process(target=dispatch_and_die, args=(url, provider, point))
    process.start()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL


def test_smtp_send_recorded_by_nobody_is_held_as_ambiguous(store_url, mail_box):
    with SmtpSink() as sink:
        box = mail_box(store_url, sink.url)
        with FrozenClock(box, at=T0) as clock:
            enqueue_customers(box, [1])
            drain(box, dispatch=False)
            kill_dispatcher_at(
                store_url, sink.url, "dispatcher.after_provider_accept_before_record"
            )
            [row] = box.store.outbox_find_by_key(KEY)
            assert row.state == "sending"  # the marker written before the call survived
            clock.advance(timedelta(minutes=10))
            result = drain(box, raise_on_failure=False)
        [row] = box.store.outbox_find_by_key(KEY)
        assert row.state == "ambiguous" and result.dispatched.sent == 0
        assert sink.tokens() == [derive_token(SECRET, KEY)]  # delivered exactly as once


def test_smtp_killed_before_the_marker_resends_without_ambiguity(store_url, mail_box):
    with SmtpSink() as sink:
        box = mail_box(store_url, sink.url)
        with FrozenClock(box, at=T0) as clock:
            enqueue_customers(box, [1])
            drain(box, dispatch=False)
            kill_dispatcher_at(store_url, sink.url, "dispatcher.after_lease")
            clock.advance(timedelta(minutes=10))
            assert drain(box).dispatched.sent == 1
        assert sink.tokens() == [derive_token(SECRET, KEY)]
        [row] = box.store.outbox_find_by_key(KEY)
        assert row.attempt == 1  # the lease that never sent spent nothing


def test_http_send_recorded_by_nobody_is_resent_and_deduplicated(store_url, mail_box):
    with FakeEmailApi() as api:
        box = mail_box(store_url, api.url)
        with FrozenClock(box, at=T0) as clock:
            enqueue_customers(box, [1, 2])
            drain(box, dispatch=False)
            kill_dispatcher_at(store_url, api.url, "dispatcher.after_provider_accept_before_record")
            clock.advance(timedelta(minutes=10))
            result = drain(box)
        assert result.dispatched.sent == 2
        tokens = api.tokens()
        assert sorted(str(t) for t in tokens) == sorted(
            derive_token(SECRET, f"weekly-digest/customer-{c}/2026-W33") for c in (1, 2)
        )  # zero duplicate deliveries: the resend was answered from the provider's memory
