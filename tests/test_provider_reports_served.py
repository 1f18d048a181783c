"""Held sends settled from the provider's record, end to end over real HTTP: the fake email API
takes messages whose acknowledgements are lost, then reports them through signed webhooks —
late, twice, out of order, some first with a bad signature — to the receiver served by uvicorn;
and a provider whose search by Message-ID is asked by the resolver."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from oncebox import Reports, Retry
from oncebox.api.deliveries import create_receiver
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.fakes.smtp_sink import SmtpSink
from oncebox.lanes.resolver import AmbiguityResolver
from oncebox.providers import Outgoing, from_url
from oncebox.providers.http import SearchableHttpEmailProvider
from oncebox.testing import drain
from support.api_server import served
from support.contract import advance
from support.outbox import enqueue_customers
from support.reports import SECRET, SECRET_ENV, signed
from test_http_provider import canned_http

KEY = "weekly-digest/customer-{}/2026-W33"
# unknown outcomes are held at once: the provider's idempotency window is taken as passed
HELD_AT_ONCE = "?timeout=1&window_hours=0"


@pytest.fixture
def api() -> Iterator[FakeEmailApi]:
    with FakeEmailApi() as server:
        yield server


def states(box, customers) -> list[tuple[str, str | None]]:
    rows = [box.store.outbox_find_by_key(KEY.format(c))[0] for c in customers]
    return [(r.state, r.reported) for r in rows]


def test_every_lost_acknowledgement_is_settled_by_its_webhook_with_no_second_send(
    api, store_url, mail_box, monkeypatch
):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    customers = [1, 2, 3, 4]
    box = mail_box(store_url, api.url + HELD_AT_ONCE, reports=Reports(secret_env=SECRET_ENV))
    with served(create_receiver(box)) as base:
        api.send_webhooks(
            f"{base}/email",
            SECRET,
            delay=0.2,
            duplicates=1,
            reorder=True,
            bad_signature_every=3,
            outcomes={"customer-4@freight.example": "email.bounced"},
        )
        api.script(*["accept-then-timeout:2"] * len(customers))
        enqueue_customers(box, customers)
        drain(box, raise_on_failure=False)
        assert [s for s, _ in states(box, customers)].count("ambiguous") >= 1
        assert api.wait_webhooks(timeout=60)
    # events that arrived before their row was held are settled by the resolver's round
    AmbiguityResolver(box.store, box.channels).run_once()
    assert states(box, customers) == [
        ("sent", "delivered"),
        ("sent", "delivered"),
        ("sent", "delivered"),
        ("sent", "bounced"),
    ]
    assert Counter(api.tokens()).most_common(1)[0][1] == 1  # no message sent twice
    refused = [a for a in api.webhook_log if not a.signed_ok]
    assert refused and all(a.outcome == 401 for a in refused)
    receipts = {box.store.outbox_find_by_key(KEY.format(c))[0].receipt for c in customers}
    assert receipts == {f"fake-{n}" for n in range(1, 5)}
    counters = box.store.counter_list()
    assert counters["reports:email:reported"] == 4 and counters["reports:email:bounced"] == 1
    assert counters["provider_events_duplicate"] >= 4  # every event came twice


def outgoing(token: str) -> Outgoing:
    payload = {
        "to": ["x@y.example"],
        "from": "digest@oncebox.example",
        "subject": "s",
        "text": "t",
        "date": "Mon, 17 Aug 2026 09:00:00 +0000",
        "headers": {},
    }
    return Outgoing(1, "email", token, payload, 1)


def test_a_searchable_provider_answers_by_our_message_id(api):
    provider = from_url(api.url + "?lookup=message_id")
    assert isinstance(provider, SearchableHttpEmailProvider)
    try:
        taken = outgoing("a" * 32)
        provider.send(taken, "oncebox-" + "a" * 32)
        answer, receipt = provider.status(taken, "unused")
        assert (answer, receipt and receipt.provider_id) == ("sent", "fake-1")
        assert provider.status(outgoing("b" * 32), "unused") == ("not_found", None)
        api.script("lookup-500")
        assert provider.status(taken, "unused") == ("unknown", None)
        api.script("lookup-reset")
        assert provider.status(taken, "unused") == ("unknown", None)
    finally:
        provider.close()
    assert not hasattr(from_url(api.url), "status")  # Resend cannot be searched


OURS = {"id": "re_1", "last_event": "delivered", "tags": [{"name": "oncebox", "value": "a" * 32}]}


@pytest.mark.parametrize(
    ("answer", "status", "meaning"),
    [
        ({"object": "list", "data": [OURS]}, 200, "sent"),
        ({"object": "list", "data": []}, 200, "not_found"),
        ({"object": "list", "data": [{**OURS, "last_event": "failed"}]}, 200, "unknown"),
        # a search that ignored the filter: recent messages, none of them ours
        (
            {
                "object": "list",
                "data": [{**OURS, "tags": [{"name": "oncebox", "value": "b" * 32}]}],
            },
            200,
            "unknown",
        ),
        ({"object": "list", "data": {}}, 200, "unknown"),  # not a list: unreadable
        ({"object": "list"}, 200, "unknown"),
        ({"name": "not_found"}, 404, "unknown"),  # no search here
        ({"name": "internal"}, 500, "unknown"),
    ],
)
def test_a_search_answer_counts_only_when_it_is_readable_and_ours(answer, status, meaning):
    with canned_http(status, body=json.dumps(answer).encode()) as (url, hits):
        provider = from_url(f"{url}?lookup=message_id")
        try:
            found, _receipt = provider.status(outgoing("a" * 32), "unused")  # type: ignore[attr-defined]
        finally:
            provider.close()  # type: ignore[attr-defined]
    assert found == meaning
    assert hits and hits[0].startswith("/emails?message_id=")


def test_a_channel_that_cannot_be_searched_waits_only_its_grace(
    api, store_url, mail_box, monkeypatch
):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    reports = Reports(secret_env=SECRET_ENV, grace=timedelta(0), unreported="resend")
    box = mail_box(store_url, api.url + HELD_AT_ONCE, reports=reports)
    api.script("reset")  # no answer, nothing taken
    enqueue_customers(box, [1])
    drain(box, raise_on_failure=False)
    # the API's own lookup_lag (300 s by default) is a search's, not a grace: resent at once
    assert AmbiguityResolver(box.store, box.channels).run_once().resent == 1


def test_the_resolver_settles_by_lookup_and_resends_what_was_never_taken_after_the_lag(
    api, store_url, mail_box
):
    box = mail_box(store_url, api.url + HELD_AT_ONCE + "&lookup=message_id&lookup_lag_s=600")
    api.script("accept-then-timeout:2", "reset")  # taken, answer lost; not taken, no answer
    enqueue_customers(box, [1, 2])
    drain(box, raise_on_failure=False)
    assert [s for s, _ in states(box, [1, 2])] == ["ambiguous", "ambiguous"]
    resolver = AmbiguityResolver(box.store, box.channels)
    result = resolver.run_once()
    assert (result.sent, result.waiting) == (1, 1)
    assert [s for s, _ in states(box, [1, 2])] == ["sent", "ambiguous"]
    advance(box.store, timedelta(minutes=10))
    assert resolver.run_once().resent == 1
    drain(box)
    assert [s for s, _ in states(box, [1, 2])] == ["sent", "sent"]
    assert sorted(Counter(api.tokens()).values()) == [1, 1]


def test_an_smtp_relay_that_reports_settles_a_lost_acknowledgement_by_the_header_it_kept(
    store_url, mail_box, monkeypatch
):
    """Plain SMTP has no record to ask; a provider's SMTP relay with webhooks does, and its
    events carry the headers it received — X-Oncebox-Token, on every message oncebox sends."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    with SmtpSink() as relay:
        box = mail_box(store_url, relay.url, reports=Reports(secret_env=SECRET_ENV))
        relay.script("drop")  # received, the connection closed before the 250
        enqueue_customers(box, [1])
        drain(box, raise_on_failure=False)
        [mail] = relay.received
    [row] = box.store.outbox_find_by_key(KEY.format(1))
    assert row.state == "ambiguous"
    assert mail.message["X-Oncebox-Token"] == row.token
    headers = [{"name": name, "value": str(value)} for name, value in mail.message.items()]
    data = {"email_id": "relay-1", "to": list(mail.rcpt_tos), "headers": headers}
    body, signed_headers = signed({"type": "email.delivered", "data": data})
    with TestClient(create_receiver(box)) as client:
        answer = client.post("/email", content=body, headers=signed_headers)
    assert answer.json() == {"outcome": "recorded", "stage": "delivered", "settled": True}
    [row] = box.store.outbox_find_by_key(KEY.format(1))
    assert (row.state, row.receipt, row.reported) == ("sent", "relay-1", "delivered")


def test_a_report_that_arrives_after_the_send_was_held_settles_it_at_once(
    api, store_url, mail_box, monkeypatch
):
    monkeypatch.setenv(SECRET_ENV, SECRET)
    box = mail_box(store_url, api.url + HELD_AT_ONCE, reports=Reports(secret_env=SECRET_ENV))
    api.script("accept-then-timeout:2")
    enqueue_customers(box, [1])
    drain(box, raise_on_failure=False)  # no webhook yet: the send is held
    [row] = box.store.outbox_find_by_key(KEY.format(1))
    assert row.state == "ambiguous"
    with served(create_receiver(box)) as base:
        api.send_webhooks(f"{base}/email", SECRET)
        api.emit_raw("email.delivered", {"email_id": "fake-1", "tags": {"oncebox": row.token}})
        api.emit_raw("email.delivered", {"email_id": "fake-1"}, stale=True)  # refused: old
        assert api.wait_webhooks(timeout=60)
    [row] = box.store.outbox_find_by_key(KEY.format(1))  # no resolver round ran
    assert (row.state, row.receipt, row.reported) == ("sent", "fake-1", "delivered")
    assert [a.outcome for a in api.webhook_log if not a.signed_ok] == [401]


@pytest.mark.parametrize(
    ("action", "taken_before"),
    [("accept-then-timeout:2", True), ("reset", False)],
)
def test_a_send_held_inside_the_window_is_settled_by_its_idempotency_key(
    api, store_url, mail_box, action, taken_before
):
    """Its attempts spent on unknown outcomes, the row is held while the API still remembers
    its key: the resolver's send under that key is answered with the first reply (the API had
    it) or taken now (it had not) — one copy either way."""
    box = mail_box(store_url, api.url + "?timeout=1", retry=Retry(max_attempts=1))
    api.script(action)
    enqueue_customers(box, [1])
    drain(box, raise_on_failure=False)
    [row] = box.store.outbox_find_by_key(KEY.format(1))
    assert row.state == "ambiguous"
    assert len(api.delivered) == int(taken_before)
    result = AmbiguityResolver(box.store, box.channels).run_once()
    [row] = box.store.outbox_find_by_key(KEY.format(1))
    assert (result.sent, row.state, row.receipt) == (1, "sent", "fake-1")
    assert len(api.delivered) == 1  # one copy
    [audit] = box.store.audit_list(target_id=row.id)
    assert audit.actor == "resolver" and "idempotency key" in audit.reason


def test_a_send_held_near_the_end_of_the_window_is_not_sent_again(api, store_url, mail_box):
    box = mail_box(store_url, api.url + "?timeout=1", retry=Retry(max_attempts=1))
    api.script("reset")
    enqueue_customers(box, [1])
    drain(box, raise_on_failure=False)
    advance(box.store, timedelta(hours=23, minutes=51))  # 9 minutes of the 24 h left
    result = AmbiguityResolver(box.store, box.channels).run_once()
    assert (result.sent, result.unknown) == (0, 1)
    assert api.delivered == []
