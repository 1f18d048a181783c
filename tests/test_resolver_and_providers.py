"""The ambiguity resolver, and the providers' own rules (parsing, framing, classification)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from oncebox import ConfigurationError
from oncebox.lanes.resolver import AmbiguityResolver
from oncebox.providers import Outgoing, Receipt, SendAmbiguous, from_url
from oncebox.providers.http import HttpEmailProvider
from oncebox.providers.local import FileProvider
from oncebox.providers.replies import parse_retry_after
from oncebox.providers.smtp import dot_stuffed
from oncebox.testing import drain
from support.outbox import enqueue_customers

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


class LossyProvider:
    """Non-idempotent; accepts some messages but never answers; knows what it received."""

    name = "lossy"
    idempotent = False
    idempotency_window = None

    def __init__(self, lose_answer: bool) -> None:
        self.lose_answer = lose_answer
        self.received: list[str] = []

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        if self.lose_answer:
            self.received.append(outgoing.token)
        raise SendAmbiguous("connection lost after DATA")

    def status(self, outgoing: Outgoing, idempotency_key: str):
        if outgoing.token in self.received:
            return "sent", Receipt(f"found-{outgoing.token[:6]}")
        return "not_found", None


@pytest.mark.parametrize("received", [True, False])
def test_the_resolver_settles_ambiguous_rows_from_the_providers_status(
    store_url, mail_box, received
):
    provider = LossyProvider(lose_answer=received)
    box = mail_box(store_url, provider)
    enqueue_customers(box, [1])
    drain(box, raise_on_failure=False)
    [row] = box.store.outbox_find_by_key("weekly-digest/customer-1/2026-W33")
    assert row.state == "ambiguous"
    result = AmbiguityResolver(box.store, box.channels).run_once()
    [row] = box.store.outbox_find_by_key("weekly-digest/customer-1/2026-W33")
    if received:
        assert (result.sent, row.state, row.receipt) == (1, "sent", f"found-{row.token[:6]}")
    else:
        assert (result.resent, row.state) == (1, "pending")
    [audit] = box.store.audit_list(target_id=row.id)
    assert audit.actor == "resolver"


def test_a_file_sink_writes_each_message_once_however_often_it_is_sent(tmp_path):
    provider = FileProvider(tmp_path / "out")
    outgoing = Outgoing(
        1,
        "email",
        "a" * 32,
        {
            "to": ["x@y.example"],
            "subject": "s",
            "text": "t",
            "date": "Mon, 17 Aug 2026 09:00:00 +0000",
            "headers": {},
        },
        1,
    )
    first = provider.send(outgoing, "k")
    again = provider.send(outgoing, "k")
    assert first.detail.endswith(".eml") and "already written" in again.detail
    assert [p.name for p in (tmp_path / "out").iterdir()] == [f"{'a' * 32}.eml"]
    assert provider.status(outgoing, "k")[0] == "sent"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", timedelta(seconds=120)),
        ("1.5", timedelta(seconds=1.5)),
        ("0", timedelta(0)),
        ("-5", timedelta(0)),
        ("30, 30", timedelta(seconds=30)),
        ("abc", None),
        ("", None),
        (None, None),
        ("nan", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", timedelta(0)),  # a date in the past: now
    ],
)
def test_retry_after_values(value, expected):
    assert parse_retry_after(value) == expected


def test_retry_after_as_an_http_date_is_measured_from_the_responses_date():
    wait = parse_retry_after("Mon, 17 Aug 2026 09:02:00 GMT", "Mon, 17 Aug 2026 09:00:00 GMT")
    assert wait == timedelta(minutes=2)
    assert parse_retry_after("1e12") == timedelta(days=36500)  # the channel then caps it


def test_smtp_data_is_dot_stuffed_and_terminated():
    assert dot_stuffed(b"a\n.b\r\n..c\rd") == b"a\r\n..b\r\n...c\r\nd\r\n.\r\n"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("carrier-pigeon://x", "not supported"),
        ("nonsense", "is not a URL"),
        ("file://", "names no directory"),
        ("smtp://host:25?timeout=soon", "timeout='soon' must be a number"),
    ],
)
def test_bad_provider_urls_are_refused(url, why):
    with pytest.raises(ConfigurationError, match=why):
        from_url(url)


def test_provider_urls_pick_their_provider(tmp_path):
    assert from_url(f"file://{tmp_path}").name == "file"
    assert from_url("console:").name == "console"
    smtp = from_url("smtps://mailer:secret@mail.example:2465")
    assert (smtp.name, smtp.idempotent) == ("smtp", False)
    http = from_url("resend://")
    assert (http.name, http.idempotent, http.idempotency_window) == (
        "http",
        True,
        timedelta(hours=24),
    )
    assert isinstance(http, HttpEmailProvider)
    http.close()
    assert "secret" not in repr(vars(smtp).get("where"))
    assert Path(str(tmp_path)).exists()


def test_an_email_date_header_is_the_instant_in_its_own_zone_even_after_an_equal_instant():
    from datetime import timezone

    from oncebox.providers.email_payload import email_payload

    def date_of(at: datetime) -> str:
        payload = email_payload(
            to="a@example.com",
            subject="s",
            text="t",
            html=None,
            headers=None,
            sender=None,
            reply_to=None,
            date=at,
        )
        return str(payload["date"])

    noon = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert date_of(noon) == "Tue, 01 Dec 2026 12:00:00 +0000"
    # the same instant, an hour east: an equal datetime, formatted in its own zone
    east = noon.astimezone(timezone(timedelta(hours=1)))
    assert date_of(east) == "Tue, 01 Dec 2026 13:00:00 +0100"
    assert date_of(noon + timedelta(seconds=1)) == "Tue, 01 Dec 2026 12:00:01 +0000"
