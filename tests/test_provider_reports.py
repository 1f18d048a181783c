"""Held sends settled from the provider's own record: the delivery webhooks' receiver (signed
Svix-style events, a replay window, duplicates and reordering harmless, foreign events counted
and ignored), the resolver settling from events recorded before a row was held, and the grace
before any resend of a held row the provider may still report on."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from oncebox import Box, ConfigurationError, Reports
from oncebox.api.deliveries import create_receiver
from oncebox.cli.app import main
from oncebox.cli.prometheus import reports as report_metrics
from oncebox.lanes.resolver import AmbiguityResolver
from oncebox.providers import Outgoing, Receipt
from oncebox.status import status_data
from oncebox.testing import drain
from support.contract import advance
from support.outbox import enqueue_customers
from support.reports import SECRET, SECRET_ENV, LostAcks, signed

KEY = "weekly-digest/customer-{}/2026-W33"


class Lookup(LostAcks):
    """The same, with a lookup that never finds anything (its log lags behind)."""

    def status(self, outgoing: Outgoing, idempotency_key: str) -> tuple[str, Receipt | None]:
        return "not_found", None


@pytest.fixture(autouse=True)
def secret_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


def reporting_box(
    mail_box: Callable[..., Box], store_url: str, provider: Any = None, **reports: Any
) -> Box:
    return mail_box(
        store_url, provider or LostAcks(), reports=Reports(secret_env=SECRET_ENV, **reports)
    )


def held(box: Box, customers: list[int]) -> list[str]:
    """Send to `customers` an hour after their messages were written, every acknowledgement
    lost: their rows held (then, not when written); their tokens."""
    enqueue_customers(box, customers)
    drain(box, dispatch=False)
    advance(box.store, timedelta(hours=1))
    drain(box, raise_on_failure=False)
    rows = [box.store.outbox_find_by_key(KEY.format(c))[0] for c in customers]
    assert [r.state for r in rows] == ["ambiguous"] * len(customers)
    return [r.token for r in rows]


def event(kind: str, token: str | None, email_id: str = "re_1") -> dict[str, Any]:
    data: dict[str, Any] = {"email_id": email_id, "to": ["x@y.example"], "subject": "s"}
    if token is not None:
        data["tags"] = {"oncebox": token}
    return {"type": kind, "created_at": "2026-08-17T09:00:01.000Z", "data": data}


@pytest.fixture
def client_for() -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(box: Box) -> TestClient:
        client = TestClient(create_receiver(box))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def post(client: TestClient, payload: dict[str, Any], **signing: Any) -> Any:
    body, headers = signed(payload, **signing)
    return client.post("/email", content=body, headers=headers)


def row_of(box: Box, customer: int) -> Any:
    return box.store.outbox_find_by_key(KEY.format(customer))[0]


def test_a_held_send_the_provider_reports_is_settled_sent_with_its_receipt(
    store_url, mail_box, client_for
):
    box = reporting_box(mail_box, store_url)
    [token] = held(box, [1])
    client = client_for(box)
    answer = post(client, event("email.delivered", token, "re_42"))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"outcome": "recorded", "stage": "delivered", "settled": True}
    row = row_of(box, 1)
    assert (row.state, row.receipt, row.reported) == ("sent", "re_42", "delivered")
    [audit] = box.store.audit_list(target_id=row.id)
    assert audit.actor == "provider" and "delivered" in audit.reason


def test_duplicates_and_reordering_leave_a_message_at_its_furthest_stage(
    store_url, mail_box, client_for
):
    box = reporting_box(mail_box, store_url)
    [token] = held(box, [1])
    client = client_for(box)
    bounced = event("email.bounced", token)
    first = post(client, bounced, event_id="msg_b")
    assert first.json()["settled"] is True  # a bounce says the provider took it
    again = post(client, bounced, event_id="msg_b")
    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    late = post(client, event("email.sent", token), event_id="msg_a")
    assert late.json() == {"outcome": "recorded", "stage": "accepted", "settled": False}
    row = row_of(box, 1)
    assert (row.state, row.reported) == ("sent", "bounced")
    assert len(box.store.audit_list(target_id=row.id)) == 1  # settled once
    counters = box.store.counter_list()
    assert counters["provider_events"] == 2 and counters["provider_events_duplicate"] == 1
    figures = status_data(box, 0)["reports"]["email"]
    assert (figures["reported"], figures["bounced"], figures["bounce_rate"]) == (1, 1, 1.0)
    assert "provider_events" in status_data(box, 0)["counters"]
    assert not any(":" in name for name in status_data(box, 0)["counters"])
    exported = {m.name: m for m in report_metrics(status_data(box, 0))}
    samples = {
        tuple(s.labels.values()): s.value for s in exported["oncebox_provider_reports"].samples
    }
    assert samples[("email", "bounced")] == 1 and samples[("email", "delivered")] == 0
    [ratio] = exported["oncebox_bounce_ratio"].samples
    assert ratio.value == 1.0
    said = CliRunner().invoke(main, ["status", "--db", store_url]).output
    assert (
        "reports    email: 1 message(s) reported on (bounced 1); bounce rate 100.00 %, "
        "complaint rate 0.00 %"
    ) in said


def test_a_failed_send_reported_by_the_provider_stays_held_for_a_person(
    store_url, mail_box, client_for
):
    box = reporting_box(mail_box, store_url)
    [token] = held(box, [1])
    answer = post(client_for(box), event("email.failed", token))
    assert answer.json() == {"outcome": "recorded", "stage": "failed", "settled": False}
    assert (row_of(box, 1).state, row_of(box, 1).reported) == ("ambiguous", "failed")
    assert AmbiguityResolver(box.store, box.channels).run_once().reported == 0
    assert row_of(box, 1).state == "ambiguous"


def test_events_about_foreign_or_unknown_messages_are_acknowledged_counted_and_ignored(
    store_url, mail_box, client_for
):
    box = reporting_box(mail_box, store_url)
    held(box, [1])
    client = client_for(box)
    foreign = post(client, event("email.delivered", "f" * 32))
    untagged = post(client, event("email.delivered", None))
    untracked = post(client, event("contact.created", None))
    for answer in (foreign, untagged, untracked):
        assert answer.status_code == 200 and answer.json()["outcome"] == "unmatched"
    assert box.store.counter_list()["provider_events_unmatched"] == 3
    assert row_of(box, 1).state == "ambiguous"


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ({"secret": "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"}, "no v1 signature"),
        ({"at": 1_000_000_000}, "old"),
        ({"prefix": "x"}, "missing"),
    ],
)
def test_a_request_that_does_not_verify_is_refused_and_writes_nothing(
    store_url, mail_box, client_for, tamper, reason
):
    box = reporting_box(mail_box, store_url)
    [token] = held(box, [1])
    answer = post(client_for(box), event("email.delivered", token), **tamper)
    assert answer.status_code == 401 and reason in answer.json()["detail"]
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"] == "urn:oncebox:problem:signature-refused"
    row = row_of(box, 1)
    assert (row.state, row.reported) == ("ambiguous", None)
    assert box.store.provider_event_list(row.id) == []
    assert "provider_events" not in box.store.counter_list()


def test_standard_webhooks_headers_verify_as_svix_ones_do(store_url, mail_box, client_for):
    box = reporting_box(mail_box, store_url)
    [token] = held(box, [1])
    answer = post(client_for(box), event("email.sent", token), prefix="webhook")
    assert answer.json()["settled"] is True


def test_what_is_not_an_event_is_answered_with_what_is_wrong(store_url, mail_box, client_for):
    box = reporting_box(mail_box, store_url)
    client = client_for(box)
    unknown = client.post("/sms", content=b"{}")
    assert unknown.status_code == 404 and "'sms'" in unknown.json()["detail"]
    big = client.post("/email", content=b"x" * (256 * 1024 + 1))
    assert big.status_code == 413
    body, headers = signed({"data": {}})
    shapeless = client.post("/email", content=body, headers=headers)  # signed: the provider's
    assert shapeless.status_code == 200 and shapeless.json()["outcome"] == "unreadable"
    assert box.store.counter_list()["provider_events_unreadable"] == 1
    assert client.get("/email").status_code == 405


def test_the_receiver_refuses_to_start_without_its_secret(store_url, mail_box, monkeypatch):
    box = reporting_box(mail_box, store_url)
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(ConfigurationError, match=SECRET_ENV):
        create_receiver(box)


def test_an_event_recorded_before_its_send_was_held_is_settled_by_the_resolver(
    store_url, mail_box, client_for
):
    box = reporting_box(mail_box, store_url)
    enqueue_customers(box, [1])
    drain(box, dispatch=False)  # the job wrote its message; nothing sent yet
    token = row_of(box, 1).token
    # the provider's webhook outruns the dispatcher's record of its unknown outcome
    early = post(client_for(box), event("email.sent", token, "re_7"))
    assert early.json() == {"outcome": "recorded", "stage": "accepted", "settled": False}
    drain(box, raise_on_failure=False)
    assert (row_of(box, 1).state, row_of(box, 1).reported) == ("ambiguous", "accepted")
    result = AmbiguityResolver(box.store, box.channels).run_once()
    assert (result.reported, result.resent) == (1, 0)
    row = row_of(box, 1)
    assert (row.state, row.receipt) == ("sent", "re_7")
    [audit] = box.store.audit_list(target_id=row.id)
    assert audit.actor == "provider"


def test_an_unreported_held_send_is_resent_only_after_the_grace_when_told_to(store_url, mail_box):
    box = reporting_box(mail_box, store_url, grace=timedelta(hours=2), unreported="resend")
    held(box, [1])
    resolver = AmbiguityResolver(box.store, box.channels)
    assert resolver.run_once().waiting == 1
    advance(box.store, timedelta(hours=1, minutes=59))
    assert resolver.run_once().waiting == 1
    assert row_of(box, 1).state == "ambiguous"
    advance(box.store, timedelta(minutes=1))
    assert resolver.run_once().resent == 1
    row = row_of(box, 1)
    assert row.state == "pending"
    [audit] = box.store.audit_list(target_id=row.id)
    assert audit.actor == "resolver" and "grace" in audit.reason


def test_a_held_send_any_event_names_is_never_resent_on_its_own(store_url, mail_box, client_for):
    box = reporting_box(mail_box, store_url, grace=timedelta(0), unreported="resend")
    tokens = held(box, [1, 2])
    client = client_for(box)
    post(client, event("email.failed", tokens[0]))
    post(client, event("email.suppressed", tokens[1]))  # a kind oncebox does not track
    result = AmbiguityResolver(box.store, box.channels).run_once()
    assert (result.resent, result.unknown) == (0, 2)
    assert [row_of(box, c).state for c in (1, 2)] == ["ambiguous", "ambiguous"]


def test_an_unreported_held_send_stays_held_for_a_person_by_default(store_url, mail_box):
    box = reporting_box(mail_box, store_url)
    held(box, [1])
    advance(box.store, timedelta(days=3))
    result = AmbiguityResolver(box.store, box.channels).run_once()
    assert (result.unknown, result.resent, row_of(box, 1).state) == (1, 0, "ambiguous")


def test_a_lookup_that_cannot_find_a_held_send_waits_out_the_grace_before_a_resend(
    store_url, mail_box
):
    box = reporting_box(mail_box, store_url, provider=Lookup(), grace=timedelta(minutes=30))
    held(box, [1, 2])
    resolver = AmbiguityResolver(box.store, box.channels, batch_size=1)  # a page a round
    first, second = resolver.run_once(), resolver.run_once()
    assert (first.waiting, first.more, second.waiting, second.more) == (1, True, 1, True)
    assert resolver.run_once().more is False  # the end: the next round starts again
    advance(box.store, timedelta(minutes=30))
    assert [resolver.run_once().resent for _ in range(2)] == [1, 1]
    assert [row_of(box, c).state for c in (1, 2)] == ["pending", "pending"]


def test_reports_are_checked_when_declared(mail_box, store_url):
    with pytest.raises(ConfigurationError, match="unreported"):
        Reports(secret_env=SECRET_ENV, unreported="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="grace"):
        Reports(secret_env=SECRET_ENV, grace=timedelta(seconds=-1))
    with pytest.raises(ConfigurationError, match="reports"):
        mail_box(store_url, LostAcks(), reports={"secret_env": SECRET_ENV})


def test_outbox_show_says_what_the_provider_reported(store_url, mail_box, client_for):
    from click.testing import CliRunner

    from oncebox.cli.app import main

    box = reporting_box(mail_box, store_url)
    [token] = held(box, [1])
    provider_id = "re_\x1b[31m\nmessage 9  email  state=sent"  # a forged line, inert
    post(client_for(box), event("email.delivered", token, provider_id), event_id="msg_d")
    shown = CliRunner().invoke(main, ["outbox", "show", KEY.format(1), "--db", store_url])
    assert shown.exit_code == 0, shown.output
    assert "the provider reports it delivered" in shown.output
    assert "provider event email.delivered msg_d" in shown.output
    assert "\x1b" not in shown.output  # the provider's text is inert
    assert not any(line.startswith("message 9") for line in shown.output.splitlines())
    as_json = CliRunner().invoke(
        main, ["outbox", "show", KEY.format(1), "--db", store_url, "--json"]
    )
    [record] = json.loads(as_json.output)
    assert record["reported"] == "delivered"
    assert [e["event_id"] for e in record["provider_events"]] == ["msg_d"]


def test_outbox_list_filters_by_what_the_provider_reported(store_url, mail_box, client_for):
    box = reporting_box(mail_box, store_url)
    tokens = held(box, [1, 2])
    client = client_for(box)
    post(client, event("email.bounced", tokens[0]))
    post(client, event("email.delivered", tokens[1]))
    listed = CliRunner().invoke(
        main, ["outbox", "list", "--reported", "bounced", "--db", store_url, "--json"]
    )
    assert [m["key"] for m in json.loads(listed.output)] == [KEY.format(1)]
    table = CliRunner().invoke(main, ["outbox", "list", "--db", store_url])
    assert "sent (bounced)" in table.output and "sent (delivered)" in table.output
    wrong = CliRunner().invoke(main, ["outbox", "list", "--reported", "lost", "--db", store_url])
    assert wrong.exit_code == 2
