"""The HTTP email provider's reading of every answer: each status classified (receipt,
retryable, throttled, permanent, ambiguous), odd success bodies still receipts, redirects never
followed, Retry-After parsed on the wire and never raised.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncebox.fakes.email_api import FakeEmailApi
from oncebox.providers import Outgoing, Receipt, from_url
from oncebox.providers.base import (
    SendAmbiguous,
    SendError,
    SendPermanent,
    SendRetryable,
    SendThrottled,
)
from oncebox.providers.http import HttpEmailProvider
from oncebox.providers.replies import Reply, parse_retry_after, read_reply

OUTGOING = Outgoing(
    1,
    "email",
    "a" * 32,
    {
        "to": ["x@y.example"],
        "from": "digest@oncebox.example",
        "subject": "s",
        "text": "t",
        "date": "Mon, 17 Aug 2026 09:00:00 +0000",
        "headers": {},
    },
    1,
)


RESPONSE_DATE = "Mon, 17 Aug 2026 09:00:00 GMT"


def send_once(url: str) -> Receipt | SendError:
    """One send through the real HTTP client; a SendError is returned, anything else raised."""
    provider = from_url(f"{url}?timeout=5")
    assert isinstance(provider, HttpEmailProvider)
    try:
        return provider.send(OUTGOING, "idem-key-1")
    except SendError as exc:
        return exc
    finally:
        provider.close()


@contextmanager
def canned_http(
    status: int, headers: tuple[tuple[str, str], ...] = (), body: bytes = b""
) -> Iterator[tuple[str, list[str]]]:
    """A one-answer HTTP server on loopback, for answers the fake API cannot give (an empty
    200, a 204, a redirect elsewhere, duplicated or obsolete-format headers). Its Date header is
    fixed at RESPONSE_DATE."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def date_time_string(self, timestamp: float | None = None) -> str:
            return RESPONSE_DATE

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hits.append(self.path)
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            has_body = status not in (204, 304)
            if has_body and not any(n.lower() == "content-length" for n, _v in headers):
                self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if has_body:
                self.wfile.write(body)

        do_GET = do_POST  # a lookup's answer, likewise

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"resend+http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def api() -> Iterator[FakeEmailApi]:
    with FakeEmailApi() as server:
        yield server


def deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


def answer(
    status: int, body: bytes, content_type: str = "application/json"
) -> tuple[httpx2.Response, Reply]:
    """A response and its body as the provider reads it (what `_classify` takes)."""
    response = httpx2.Response(
        status,
        content=body,
        headers={"content-type": content_type},
        request=httpx2.Request("POST", "http://fake.example/emails"),
    )
    return response, read_reply(response)


DEEP = b"[" * 8000 + b"]" * 8000  # within the 16 KiB read of a reply, too deep for the parser


@pytest.fixture
def http_provider() -> Iterator[HttpEmailProvider]:
    provider = from_url("resend+http://127.0.0.1:9?timeout=1")
    assert isinstance(provider, HttpEmailProvider)
    yield provider
    provider.close()


def test_a_body_too_deep_to_parse_counts_as_no_body_whatever_the_status(http_provider):
    assert answer(200, DEEP)[1].refused is None  # read whole: it is the parser that gives up
    for status in (200, 201):
        receipt = http_provider._classify(*answer(status, DEEP))
        assert isinstance(receipt, Receipt) and receipt.provider_id is None
        assert len(receipt.detail) <= 600
    with pytest.raises(SendRetryable, match="in progress"):  # an unknown 409 code
        http_provider._classify(*answer(409, DEEP))
    with pytest.raises(SendPermanent, match="HTTP 422"):
        http_provider._classify(*answer(422, DEEP))
    with pytest.raises(SendRetryable, match="HTTP 503"):
        http_provider._classify(*answer(503, DEEP))


def test_a_425_too_early_is_retryable_and_honours_retry_after():
    with FakeEmailApi() as api:
        api.script("425:30", "425")
        provider = from_url(f"{api.url}?timeout=5")
        assert isinstance(provider, HttpEmailProvider)
        try:
            outcomes = []
            for _ in range(2):
                try:
                    provider.send(OUTGOING, "idem-425")
                except SendRetryable as exc:
                    outcomes.append(exc)
        finally:
            provider.close()
        assert [o.retry_after for o in outcomes] == [timedelta(seconds=30), None]
        assert all("HTTP 425" in o.reason for o in outcomes)
        assert api.delivered == []


STATUS_CLASSES: list[tuple[int, type]] = [
    (201, Receipt),
    (202, Receipt),
    (301, SendPermanent),  # never followed
    (400, SendPermanent),
    (401, SendThrottled),  # credentials: every message alike, so the channel pauses
    (403, SendThrottled),
    (404, SendPermanent),
    (408, SendRetryable),
    (409, SendRetryable),  # an unknown 409 code reads as "in progress"
    (410, SendPermanent),
    (413, SendPermanent),
    (415, SendPermanent),
    (422, SendPermanent),
    (429, SendThrottled),
    (500, SendRetryable),
    (502, SendRetryable),
    (503, SendRetryable),
    (504, SendRetryable),
    (520, SendRetryable),
    (599, SendRetryable),
]


@pytest.mark.parametrize(
    ("status", "expected"), STATUS_CLASSES, ids=[str(s) for s, _ in STATUS_CLASSES]
)
def test_every_catalogued_status_is_classified(api, status, expected):
    api.script(str(status))
    outcome = send_once(api.url)
    assert type(outcome) is expected, outcome
    if isinstance(outcome, SendError):
        assert f"HTTP {status}" in outcome.reason
    assert api.delivered == []


@pytest.mark.parametrize(
    ("status", "headers", "body", "provider_id"),
    [
        (200, (), b"", None),  # an empty 200
        (200, (("Content-Type", "application/json"),), b'{"id": "m-1"', None),  # truncated
        (200, (("Content-Type", "text/html"),), b"<html>ok</html>", None),
        (200, (("Content-Type", "application/json; charset=no-such-charset"),), b'{"id":"m"}', "m"),
        (200, (("Content-Type", "application/json"),), b"\xff\xfe{\x00", None),  # not UTF-8
        (200, (("Content-Type", "application/json"),), b'{"id": 5}', None),  # id not a string
        (200, (("Content-Type", "application/json"),), b'{"message": "ok"}', None),  # no id
        (200, (("Content-Type", "application/json"),), b" " * (10 * 1024 * 1024), None),
        (201, (("Content-Type", "application/json"),), b'{"id": "m-2"}', "m-2"),
        (204, (), b"", None),
    ],
    ids=[
        "200-empty",
        "200-truncated-json",
        "200-html",
        "200-unknown-charset",
        "200-not-utf8",
        "200-numeric-id",
        "200-missing-id",
        "200-10MiB",
        "201-with-id",
        "204",
    ],
)
def test_odd_success_bodies_are_receipts(status, headers, body, provider_id):
    with canned_http(status, headers, body) as (url, hits):
        outcome = send_once(url)
    assert isinstance(outcome, Receipt), outcome
    assert outcome.provider_id == provider_id
    assert len(outcome.detail) <= 600  # a 10 MiB body is not copied into the receipt
    assert hits == ["/emails"]


def test_a_response_shorter_than_its_content_length_is_ambiguous():
    headers = (("Content-Length", "100"), ("Content-Type", "application/json"))
    with canned_http(200, headers, b'{"id": "cut"}') as (url, _hits):
        assert isinstance(send_once(url), SendAmbiguous)


def test_a_deeply_nested_success_body_is_still_a_classified_answer():
    headers = (("Content-Type", "application/json"),)
    with canned_http(200, headers, deep_json(10**4).encode()) as (url, _hits):
        assert isinstance(send_once(url), (Receipt, SendError))


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308, 304])
def test_a_redirect_is_never_followed_to_another_host(status):
    with canned_http(200, (("Content-Type", "application/json"),), b'{"id": "x"}') as (
        elsewhere,
        stolen,
    ):
        location = elsewhere.replace("resend+http", "http") + "/emails"
        with canned_http(status, (("Location", location),)) as (url, hits):
            outcome = send_once(url)
    assert isinstance(outcome, SendPermanent) and f"HTTP {status}" in outcome.reason
    assert (hits, stolen) == (["/emails"], [])


@pytest.mark.parametrize(
    ("action", "retry_after"),
    [
        ("429:0", timedelta(0)),
        ("429:-5", timedelta(0)),
        ("429:1.5", timedelta(seconds=1.5)),
        ("429:120", timedelta(seconds=120)),
        ("429:999999999", timedelta(seconds=999_999_999)),  # the channel caps it
        ("429:garbage", None),  # the channel's default pause
        ("429:date:-3600", timedelta(0)),  # an HTTP-date in the past
        ("429:date:315360000", timedelta(days=3650)),  # an HTTP-date ten years on
        ("503:-5", timedelta(0)),
        ("503:garbage", None),
        ("503:120", timedelta(seconds=120)),
    ],
)
def test_retry_after_values_on_the_wire_are_parsed_never_raised(api, action, retry_after):
    api.script(action)
    outcome = send_once(api.url)
    expected = SendThrottled if action.startswith("429") else SendRetryable
    assert type(outcome) is expected, outcome
    assert outcome.retry_after == retry_after


@pytest.mark.parametrize(
    ("headers", "retry_after"),
    [
        ((("Retry-After", "Monday, 17-Aug-26 09:02:00 GMT"),), timedelta(minutes=2)),  # RFC 850
        ((("Retry-After", "Mon Aug 17 09:02:00 2026"),), timedelta(minutes=2)),  # asctime
        ((("Retry-After", "30"), ("Retry-After", "60")), timedelta(seconds=30)),  # duplicated
        ((("Retry-After", ""),), None),
        ((("Retry-After", "Mon, 17 Aug 10000 09:00:00 GMT"),), None),  # year out of range
        ((("Retry-After", "1e308"),), timedelta(days=36500)),
    ],
    ids=["rfc850", "asctime", "duplicated", "empty", "year-10000", "1e308"],
)
def test_obsolete_and_duplicated_retry_after_headers(headers, retry_after):
    with canned_http(429, headers) as (url, _hits):
        outcome = send_once(url)
    assert isinstance(outcome, SendThrottled)
    assert outcome.retry_after == retry_after


@given(st.text(max_size=60), st.one_of(st.none(), st.text(max_size=40)))
def test_parse_retry_after_never_raises_and_never_goes_negative(value, date_header):
    wait = parse_retry_after(value, date_header)
    assert wait is None or wait >= timedelta(0)
