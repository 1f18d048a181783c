"""The fake email API's delivery webhooks and lookups, as Resend's: every delivered message's
events reach a receiver signed as Svix signs them, with duplicates, reordering, forged and stale
copies and retries on request; lookups by id and by Message-ID answer with the last event.

The receiver here is a plain `http.server` that checks each request with `verify_webhook` (the
`svix-*` headers mapped to their `webhook-*` names) and answers 401 when it refuses one."""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import httpx2
import pytest

from oncebox.fakes.email_api import FakeEmailApi
from oncebox.fakes.provider_webhooks import WebhookAttempt
from oncebox.providers.webhook_signatures import WebhookRefused, verify_webhook

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@dataclass(frozen=True)
class Got:
    svix_id: str
    payload: dict[str, Any]
    body: bytes


@dataclass
class Receiver:
    """What the test's endpoint saw: verified events in arrival order, refusals with reasons."""

    secret: str
    fail_first: bool = False
    received: list[Got] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def types(self) -> list[str]:
        return [got.payload["type"] for got in self.received]

    def ids(self) -> list[str]:
        return [got.svix_id for got in self.received]


class _Handler(BaseHTTPRequestHandler):
    receiver: Receiver

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def do_POST(self) -> None:
        receiver = self.receiver
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        svix_id = self.headers.get("svix-id", "")
        mapped = {
            "webhook-id": svix_id,
            "webhook-timestamp": self.headers.get("svix-timestamp", ""),
            "webhook-signature": self.headers.get("svix-signature", ""),
        }
        try:
            payload = verify_webhook(receiver.secret, mapped, body)
        except WebhookRefused as exc:
            with receiver.lock:
                receiver.refused.append((svix_id, exc.reason))
            self._answer(401)
            return
        with receiver.lock:
            first = receiver.fail_first and svix_id not in receiver.failed
            receiver.failed.add(svix_id)
            if not first:
                receiver.received.append(Got(svix_id, payload, body))
        self._answer(500 if first else 204)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextmanager
def receiving(fail_first: bool = False) -> Iterator[Receiver]:
    receiver = Receiver(SECRET, fail_first=fail_first)
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Handler", (_Handler,), {"receiver": receiver})
    )
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/resend"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def api() -> Iterator[FakeEmailApi]:
    with FakeEmailApi() as fake:
        yield fake


def base(api: FakeEmailApi) -> str:
    return f"http://{api.host}:{api.port}"


def email(
    to: str = "ada@example.com",
    oncebox_tag: str = "tok-1",
    message_id: str = "<m1@oncebox.example>",
    *,
    listed_headers: bool = False,
) -> dict[str, Any]:
    """A request body as `HttpEmailProvider._body` makes it, plus Resend's send-format tags."""
    headers: Any = {"Message-ID": message_id, "X-Oncebox-Token": oncebox_tag}
    if listed_headers:
        headers = [{"name": name, "value": value} for name, value in headers.items()]
    return {
        "from": "Digest <digest@oncebox.example>",
        "to": [to],
        "subject": "Your weekly digest",
        "text": "Hello",
        "headers": headers,
        "tags": [{"name": "oncebox", "value": oncebox_tag}],
    }


def send(api: FakeEmailApi, body: dict[str, Any], key: str = "key-1") -> httpx2.Response:
    return httpx2.post(
        f"{base(api)}/emails", json=body, headers={"Idempotency-Key": key}, timeout=5
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_delivered_message_emits_sent_then_delivered_signed_in_resends_shape(api):
    with receiving() as receiver:
        api.send_webhooks(receiver.url, SECRET)
        answer = send(api, email())
        assert answer.status_code == 200
        assert send(api, email()).headers["Idempotency-Replayed"] == "true"  # no new events
        assert api.wait_webhooks(5), api.webhook_log
    assert receiver.refused == []
    assert receiver.types() == ["email.sent", "email.delivered"]
    sent, delivered = receiver.received
    assert sent.svix_id != delivered.svix_id
    assert all(re.fullmatch(r"msg_\w+", got.svix_id) for got in receiver.received)
    assert delivered.body == json.dumps(delivered.payload, separators=(",", ":")).encode()
    assert RFC3339_MS.match(delivered.payload["created_at"]), delivered.payload
    assert delivered.payload["data"] == {
        "email_id": answer.json()["id"],
        "created_at": delivered.payload["data"]["created_at"],
        "from": "Digest <digest@oncebox.example>",
        "to": ["ada@example.com"],
        "subject": "Your weekly digest",
        "tags": {"oncebox": "tok-1"},
        "headers": [
            {"name": "Message-ID", "value": "<m1@oncebox.example>"},
            {"name": "X-Oncebox-Token", "value": "tok-1"},
        ],
    }
    assert api.webhook_log == [
        WebhookAttempt(sent.svix_id, "email.sent", 204, True),
        WebhookAttempt(delivered.svix_id, "email.delivered", 204, True),
    ]
    assert api.tokens() == ["tok-1"]


def test_duplicates_arrive_with_the_same_svix_id(api):
    with receiving() as receiver:
        api.send_webhooks(receiver.url, SECRET, duplicates=2)
        send(api, email())
        assert api.wait_webhooks(5), api.webhook_log
    ids = receiver.ids()
    assert receiver.types() == ["email.sent"] * 3 + ["email.delivered"] * 3
    assert len(set(ids[:3])) == 1 and len(set(ids[3:])) == 1 and ids[0] != ids[3], ids


def test_reorder_sends_delivered_before_sent_and_last_event_stays_delivered(api):
    with receiving() as receiver:
        api.send_webhooks(receiver.url, SECRET, reorder=True)
        message_id = send(api, email()).json()["id"]
        assert api.wait_webhooks(5), api.webhook_log
    assert receiver.types() == ["email.delivered", "email.sent"]
    assert api.last_event(message_id) == "delivered"


def test_every_kth_event_comes_first_with_a_forged_signature_then_correctly(api):
    with receiving() as receiver:
        api.send_webhooks(receiver.url, SECRET, bad_signature_every=2)
        send(api, email())
        assert api.wait_webhooks(5), api.webhook_log
    sent, delivered = receiver.received
    assert [svix_id for svix_id, _ in receiver.refused] == [delivered.svix_id]
    assert api.webhook_log == [
        WebhookAttempt(sent.svix_id, "email.sent", 204, True),
        WebhookAttempt(delivered.svix_id, "email.delivered", 401, False),
        WebhookAttempt(delivered.svix_id, "email.delivered", 204, True),
    ]


def test_a_500_is_retried_with_the_same_svix_id_until_answered_2xx(api):
    with receiving(fail_first=True) as receiver:
        api.send_webhooks(receiver.url, SECRET, backoff=0.01)
        send(api, email())
        assert api.wait_webhooks(5), api.webhook_log
    assert receiver.types() == ["email.sent", "email.delivered"]
    outcomes = [(attempt.svix_id, attempt.outcome) for attempt in api.webhook_log]
    sent, delivered = receiver.ids()
    assert outcomes == [(sent, 500), (sent, 204), (delivered, 500), (delivered, 204)]


def test_an_unreachable_receiver_is_tried_the_set_number_of_times_then_given_up(api):
    api.send_webhooks(f"http://127.0.0.1:{closed_port()}/", SECRET, attempts=3, backoff=0.001)
    send(api, email())
    assert api.wait_webhooks(10), api.webhook_log
    log = api.webhook_log
    assert [attempt.type for attempt in log] == ["email.sent"] * 3 + ["email.delivered"] * 3
    assert all(isinstance(attempt.outcome, str) for attempt in log), log


def test_a_stale_copy_is_refused_by_the_replay_window_then_sent_fresh(api):
    with receiving() as receiver:
        api.send_webhooks(receiver.url, SECRET)
        svix_id = api.emit_raw("email.delivered", {"email_id": "fake-9"}, stale=True)
        assert api.wait_webhooks(5), api.webhook_log
    assert [got.svix_id for got in receiver.received] == [svix_id]
    assert len(receiver.refused) == 1 and "old" in receiver.refused[0][1], receiver.refused
    assert [(a.outcome, a.signed_ok) for a in api.webhook_log] == [(401, False), (204, True)]


def test_outcomes_per_recipient_bounce_or_complain_and_lookups_report_them(api):
    outcomes = {"gone@example.com": "email.bounced", "angry@example.com": "email.complained"}
    with receiving() as receiver:
        api.send_webhooks(receiver.url, SECRET, outcomes=outcomes)
        bounced = send(api, email("gone@example.com"), "k1").json()["id"]
        complained = send(api, email("angry@example.com"), "k2").json()["id"]
        delivered = send(api, email("ada@example.com"), "k3").json()["id"]
        assert api.wait_webhooks(5), api.webhook_log
    by_message: dict[str, list[str]] = {}
    for got in receiver.received:
        by_message.setdefault(got.payload["data"]["email_id"], []).append(got.payload["type"])
    assert by_message == {
        bounced: ["email.sent", "email.bounced"],
        complained: ["email.sent", "email.delivered", "email.complained"],
        delivered: ["email.sent", "email.delivered"],
    }
    bounce = next(g for g in receiver.received if g.payload["type"] == "email.bounced")
    assert bounce.payload["data"]["bounce"]["type"] == "Permanent"
    last = {m: httpx2.get(f"{base(api)}/emails/{m}").json()["last_event"] for m in by_message}
    assert last == {bounced: "bounced", complained: "complained", delivered: "delivered"}


def test_events_wait_for_the_delay_and_the_lookup_says_queued_meanwhile(api):
    with receiving() as receiver:
        api.send_webhooks(receiver.url, SECRET, delay=0.5)
        message_id = send(api, email()).json()["id"]
        assert api.last_event(message_id) == "queued"
        assert not api.wait_webhooks(0.01)
        assert api.wait_webhooks(5), api.webhook_log
    assert receiver.types() == ["email.sent", "email.delivered"]
    assert api.last_event(message_id) == "delivered"


def test_lookup_by_id_answers_like_resends_retrieve_email_and_404_otherwise(api):
    message_id = send(api, email()).json()["id"]
    found = httpx2.get(f"{base(api)}/emails/{message_id}")
    assert found.status_code == 200
    body = found.json()
    assert {k: body[k] for k in ("object", "id", "to", "from", "subject", "last_event")} == {
        "object": "email",
        "id": message_id,
        "to": ["ada@example.com"],
        "from": "Digest <digest@oncebox.example>",
        "subject": "Your weekly digest",
        "last_event": "delivered",  # no webhooks configured
    }
    assert body["tags"] == [{"name": "oncebox", "value": "tok-1"}]
    assert body["created_at"].endswith("+00:00")
    missing = httpx2.get(f"{base(api)}/emails/fake-99")
    assert missing.status_code == 404 and missing.json()["name"] == "not_found"


def test_search_by_message_id_finds_dict_and_list_headers_and_answers_an_empty_list(api):
    first = send(api, email(message_id="<a@oncebox.example>"), "k1").json()["id"]
    second = send(api, email(message_id="<b@oncebox.example>", listed_headers=True), "k2")
    assert second.status_code == 200 and api.tokens() == ["tok-1", "tok-1"]

    def search(message_id: str) -> list[str]:
        answer = httpx2.get(f"{base(api)}/emails?message_id={quote(message_id, safe='')}")
        assert answer.status_code == 200 and answer.json()["object"] == "list", answer.text
        return [found["id"] for found in answer.json()["data"]]

    assert search("<a@oncebox.example>") == [first]
    assert search("b@oncebox.example") == [second.json()["id"]]  # brackets optional
    assert search("<nobody@oncebox.example>") == []


def test_lookup_actions_are_taken_by_lookups_only(api):
    api.script("lookup-500", "503")
    assert send(api, email()).status_code == 503  # the send skipped the lookup's action
    message_id = send(api, email()).json()["id"]
    assert httpx2.get(f"{base(api)}/emails/{message_id}").status_code == 500
    assert httpx2.get(f"{base(api)}/emails/{message_id}").status_code == 200
    assert api.requests == 2  # lookups are not counted as sends


def test_stop_stops_the_emitter_thread():
    api = FakeEmailApi().start()
    emitter = api.send_webhooks(f"http://127.0.0.1:{closed_port()}/", SECRET)
    assert emitter.running
    api.stop()
    assert not emitter.running
