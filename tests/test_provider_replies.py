"""Every provider and lookup reads at most 16 KiB of a reply, counted after decompression, and
never the rest: a gzip bomb or an endless body costs a few MiB at most (httpx2 decodes in pieces
of 1 MiB), not what it expands to. What is not read counts as a body that cannot be parsed — the
status still classifies a send, a lookup is "unknown" (never "not found"). Real servers on
loopback answer; memory is tracemalloc's peak while one send or lookup runs (the answers are built
before tracing starts)."""

from __future__ import annotations

import contextlib
import gzip
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from typing import Any, TypeVar

import pytest

from oncebox.fakes.loopback import QuietServer
from oncebox.providers import Outgoing, Receipt, from_url
from oncebox.providers.base import (
    SendAmbiguous,
    SendError,
    SendPermanent,
    SendRetryable,
)
from oncebox.providers.http import HttpEmailProvider, SearchableHttpEmailProvider
from oncebox.providers.webhook import WebhookProvider
from support.raw_smtp import RecordingSmtp
from test_http_provider import OUTGOING

T = TypeVar("T")
MiB = 1024 * 1024
BOUND = 4 * MiB  # a cap of 16 KiB, read through a decoder that works in pieces of 1 MiB at most
BOMB_SIZE = 64 * MiB
EMAIL = OUTGOING  # the HTTP provider's tests' message
HOOK_ENV = "ONCEBOX_TEST_REPLY_HOOK_SECRET"
HOOK = Outgoing(1, "hooks", "b" * 32, {"type": "order.shipped", "order": 1}, 1)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """64 MiB of JSON-ish padding, gzipped to about 64 KiB."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = b" " * MiB
    parts = [squeeze.compress(b'{"id": "m-bomb", "pad": "')]
    parts += [squeeze.compress(block) for _ in range(BOMB_SIZE // MiB)]
    parts.append(squeeze.compress(b'"}') + squeeze.flush())
    return b"".join(parts)


def peak(call: Callable[[], T]) -> tuple[T, int]:
    """What `call` returned, and the most memory Python held at once while it ran."""
    tracemalloc.start()
    try:
        outcome = call()
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@contextmanager
def answering(status: int, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> Iterator[str]:
    """An HTTP server on loopback giving every request this answer; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            with contextlib.suppress(OSError):  # the client stopped reading and hung up
                self.wfile.write(body)

        do_GET = do_POST

    server = QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def send(provider: Any, outgoing: Outgoing) -> Receipt | SendError:
    try:
        return provider.send(outgoing, "idem-key-1")  # type: ignore[no-any-return]
    except SendError as exc:
        return exc
    finally:
        provider.close()


GZIP = (("Content-Type", "application/json"), ("Content-Encoding", "gzip"))


@pytest.mark.parametrize(
    ("status", "expected"),
    [(200, Receipt), (422, SendPermanent), (503, SendRetryable)],
)
def test_a_gzip_bomb_answering_a_send_is_read_to_16_kib_at_most(bomb, status, expected):
    with answering(status, bomb, GZIP) as where:
        provider = from_url(f"resend+http://{where}?timeout=10")
        outcome, most = peak(lambda: send(provider, EMAIL))
    assert type(outcome) is expected, outcome
    assert most < BOUND, f"{most / MiB:.1f} MiB held reading a {len(bomb) // 1024} KiB reply"
    if isinstance(outcome, Receipt):
        assert outcome.provider_id is None  # the id is in a body that was never read whole
        assert "16 KiB" in outcome.detail and len(outcome.detail) <= 600, outcome.detail
    else:
        assert f"HTTP {status}" in outcome.reason and "16 KiB" in outcome.reason, outcome.reason


def test_an_oversized_plain_reply_to_a_send_is_not_read_past_16_kib():
    body = b'{"id": "m-big", "pad": "' + b"x" * (8 * MiB) + b'"}'
    with answering(200, body, (("Content-Type", "application/json"),)) as where:
        provider = from_url(f"resend+http://{where}?timeout=10")
        outcome, most = peak(lambda: send(provider, EMAIL))
    assert isinstance(outcome, Receipt), outcome  # the provider took it: its status says so
    assert outcome.provider_id is None and "16 KiB" in outcome.detail, outcome
    assert most < BOUND, f"{most / MiB:.1f} MiB held reading an 8 MiB reply"


@pytest.mark.parametrize("kind", ["long-none-found", "gzip-bomb"])
def test_a_lookup_reply_too_large_is_unknown_never_not_found(bomb, kind):
    headers: tuple[tuple[str, str], ...]
    if kind == "gzip-bomb":
        body, headers = bomb, GZIP
    else:  # "none found", at length: read whole, it would say not_found and cause a resend
        body, headers = b'{"object": "list", "data": []' + b" " * MiB + b"}", ()
    with answering(200, body, headers) as where:
        lookup = from_url(f"resend+http://{where}?timeout=10&lookup=message_id")
        assert isinstance(lookup, SearchableHttpEmailProvider)
        try:
            outcome, most = peak(lambda: lookup.status(EMAIL, "idem-key-1"))
        finally:
            lookup.close()
    assert outcome == ("unknown", None)
    assert most < BOUND, f"{most / MiB:.1f} MiB held reading a lookup's reply"


def test_a_small_lookup_reply_still_says_not_found():
    with answering(200, b'{"object": "list", "data": []}') as where:
        lookup = from_url(f"resend+http://{where}?timeout=10&lookup=message_id")
        assert isinstance(lookup, SearchableHttpEmailProvider)
        try:
            assert lookup.status(EMAIL, "idem-key-1") == ("not_found", None)
        finally:
            lookup.close()


def test_a_gzipped_reply_within_the_cap_is_read_decompressed():
    reply = gzip.compress(b'{"id": "m-small"}')
    with answering(200, reply, GZIP) as where:
        provider = from_url(f"resend+http://{where}?timeout=10")
        assert isinstance(provider, HttpEmailProvider)
        outcome = send(provider, EMAIL)
    assert isinstance(outcome, Receipt) and outcome.provider_id == "m-small", outcome


def test_the_webhook_channel_reads_replies_decompressed_within_the_same_cap(bomb, monkeypatch):
    monkeypatch.setenv(HOOK_ENV, "hook-signing-secret-0123456789")
    with answering(200, gzip.compress(b'{"id": "w-1"}'), GZIP) as where:
        hooks = WebhookProvider(
            f"webhook+http://{where}/hook?secret_env={HOOK_ENV}&allow=127.0.0.1"
        )
        outcome = send(hooks, HOOK)
    assert isinstance(outcome, Receipt) and outcome.provider_id == "w-1", outcome
    with answering(200, bomb, GZIP) as where:
        hooks = WebhookProvider(
            f"webhook+http://{where}/hook?secret_env={HOOK_ENV}&allow=127.0.0.1"
        )
        outcome, most = peak(lambda: send(hooks, HOOK))
    assert isinstance(outcome, Receipt) and outcome.provider_id is None, outcome
    assert most < BOUND, f"{most / MiB:.1f} MiB held reading a webhook's reply"


ENDLESS = b"".join(b"250-%06d %s\r\n" % (n, b"x" * 500) for n in range(16 * 1024)) + b"250 ok\r\n"


@pytest.mark.parametrize(
    ("command", "expected", "why"),
    [
        (b"EHLO", SendRetryable, "nothing was sent"),
        (b".", SendAmbiguous, "may have been accepted"),
    ],
    ids=["ehlo", "end-of-data"],
)
def test_an_endless_smtp_reply_is_read_to_16_kib_at_most(command, expected, why):
    server = RecordingSmtp("127.0.0.1", replies={command: ENDLESS})  # 8 MiB of continuations
    try:
        provider = from_url(f"smtp://127.0.0.1:{server.port}?timeout=10")
        outcome, most = peak(lambda: send(provider, EMAIL))
    finally:
        server.close()
    assert type(outcome) is expected, outcome
    assert isinstance(outcome, SendError) and why in outcome.reason, outcome
    assert "16 KiB" in outcome.reason, outcome.reason
    assert most < BOUND, f"{most / MiB:.1f} MiB held reading an 8 MiB SMTP reply"
