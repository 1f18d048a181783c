"""Webhooks as a channel: each message POSTed once to a receiver that checks its signature, retried,
paused and held as the email providers are, and never sent where it must not go (private or
internal addresses, redirects, plain HTTP) unless allow-listed."""

from __future__ import annotations

import base64
import contextlib
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from oncebox import Box, ConfigurationError, JobContext, Retry
from oncebox.fakes.webhook_receiver import WebhookReceiver
from oncebox.kernel.errors import InvalidArguments
from oncebox.outbox.tokens import derive_token, idempotency_key
from oncebox.providers import Outgoing, Receipt, from_url
from oncebox.providers.base import (
    SendAmbiguous,
    SendError,
    SendPermanent,
    SendRetryable,
    SendThrottled,
)
from oncebox.providers.webhook import (
    MAX_WEBHOOK_BYTES,
    WebhookProvider,
    WebhookRefused,
    verify_webhook,
)
from oncebox.testing import FrozenClock, drain

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
SECRET = "outbox-test-secret-0123456789"  # the box's, for tokens
SECRET_ENV = "ONCEBOX_TEST_HOOK_SECRET"
HOOK_SECRET = "whsec_" + base64.b64encode(b"hook-signing-key-0123456789abcdef").decode()
OUTGOING = Outgoing(1, "hooks", "a" * 32, {"type": "order.shipped", "order": 1}, 1)
WEBHOOK_ID = idempotency_key("a" * 32)


def key(order: int) -> str:
    return f"order-shipped/{order}"


def webhook_id(order: int) -> str:
    return idempotency_key(derive_token(SECRET, key(order)))


def row(box: Box, order: int) -> Any:
    [found] = box.store.outbox_find_by_key(key(order))
    return found


def hook_url(receiver: WebhookReceiver, options: str = "allow=127.0.0.1") -> str:
    return f"{receiver.url}?secret_env={SECRET_ENV}&{options}"


@pytest.fixture(autouse=True)
def signing_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, HOOK_SECRET)  # named by ?secret_env=
    monkeypatch.setenv("ONCEBOX_WEBHOOK_SECRET", HOOK_SECRET)  # the default variable


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(HOOK_SECRET) as server:
        yield server


@pytest.fixture
def hook_box(sqlite_url: str) -> Iterator[Callable[..., Box]]:
    """Boxes on SQLite whose task writes one webhook per order to the `hooks` channel."""
    built: list[Box] = []

    def make(provider: Any, **channel: Any) -> Box:
        box = Box(sqlite_url, seed=7, secret=SECRET)
        built.append(box)
        box.channel("email", provider="null:")
        box.channel("hooks", provider=provider, **channel)

        @box.task(key="order-shipped/{order}", retry=Retry(max_attempts=3))
        def order_shipped(ctx: JobContext, order: int, size: int = 0) -> None:
            ctx.outbox.add("hooks", {"type": "order.shipped", "order": order, "pad": "x" * size})

        return box

    yield make
    for box in built:
        box.close()


def enqueue(box: Box, orders: Sequence[int], size: int = 0) -> None:
    box.enqueue_many("order_shipped", [{"order": n, "size": size} for n in orders])


@contextmanager
def provider(url: str, **seams: Any) -> Iterator[WebhookProvider]:
    made = WebhookProvider(url, **seams)
    try:
        yield made
    finally:
        made.close()


def send_once(url: str, **seams: Any) -> Receipt | SendError:
    """One send through the real HTTP client; a SendError is returned, anything else raised."""
    with provider(url, **seams) as hooks:
        try:
            return hooks.send(OUTGOING, WEBHOOK_ID)
        except SendError as exc:
            return exc


def resolving_to(*answers: Sequence[str]) -> Callable[[str, int], Sequence[str]]:
    """A resolver giving each answer in turn (the last one for ever after), recording lookups."""
    pending = list(answers)

    def resolve(host: str, port: int) -> Sequence[str]:
        lookups.append((host, port))
        return pending.pop(0) if len(pending) > 1 else pending[0]

    lookups: list[tuple[str, int]] = []
    resolve.lookups = lookups  # type: ignore[attr-defined]
    return resolve


# -- end to end through a box --------------------------------------------------------------------


def test_each_message_is_posted_once_signed_under_a_webhook_id_derived_from_its_key(
    receiver, hook_box
):
    box = hook_box(hook_url(receiver))
    enqueue(box, [1, 2])
    assert drain(box).dispatched.sent == 2
    assert sorted(receiver.ids()) == sorted([webhook_id(1), webhook_id(2)]), receiver.received
    assert receiver.refused == []
    got = {r.webhook_id: r for r in receiver.received}[webhook_id(1)]
    assert got.payload == {"type": "order.shipped", "order": 1, "pad": ""}
    assert got.body == b'{"order":1,"pad":"","type":"order.shipped"}'  # compact, keys sorted
    assert got.path == "/hook" and got.headers["content-type"] == "application/json"
    assert key(1) not in repr(got)  # the raw key never leaves
    assert row(box, 1).receipt == f"rcv-{receiver.ids().index(webhook_id(1)) + 1}"
    assert not box.channels["hooks"].idempotent  # no receivers_dedupe: the sending marker


def test_verify_webhook_refuses_a_tampered_body_id_or_timestamp_a_stale_one_and_a_wrong_secret(
    receiver, hook_box
):
    box = hook_box(hook_url(receiver))
    enqueue(box, [1])
    drain(box)
    [got] = receiver.received
    headers, body = got.headers, got.body
    signed_at = datetime.fromtimestamp(got.timestamp, UTC)
    assert verify_webhook(HOOK_SECRET, headers, body, now=signed_at) == got.payload
    upper = {name.upper(): value for name, value in headers.items()}
    assert verify_webhook(HOOK_SECRET, upper, body, now=signed_at) == got.payload
    rotated = {**headers, "webhook-signature": "v1,AAAA " + headers["webhook-signature"]}
    assert verify_webhook(HOOK_SECRET, rotated, body, now=signed_at) == got.payload

    def refused(secret: str, heads: dict[str, str], raw: bytes, at: datetime) -> str:
        with pytest.raises(WebhookRefused) as caught:
            verify_webhook(secret, heads, raw, now=at)
        return caught.value.reason

    tampered = body.replace(b'"order":1', b'"order":2')
    assert "no v1 signature" in refused(HOOK_SECRET, headers, tampered, signed_at)
    other_id = {**headers, "webhook-id": webhook_id(2)}
    assert "no v1 signature" in refused(HOOK_SECRET, other_id, body, signed_at)
    later = {**headers, "webhook-timestamp": str(got.timestamp + 1)}
    assert "no v1 signature" in refused(HOOK_SECRET, later, body, signed_at)
    wrong = "whsec_" + base64.b64encode(b"another-key-0123456789abcdef").decode()
    assert "no v1 signature" in refused(wrong, headers, body, signed_at)
    stale = signed_at + timedelta(minutes=5, seconds=1)
    assert "301 s old" in refused(HOOK_SECRET, headers, body, stale)
    early = signed_at - timedelta(minutes=6)
    assert "in the future" in refused(HOOK_SECRET, headers, body, early)
    unsigned = {k: v for k, v in headers.items() if k != "webhook-signature"}
    assert "missing" in refused(HOOK_SECRET, unsigned, body, signed_at)
    odd_stamp = {**headers, "webhook-timestamp": "-1"}
    assert "Unix seconds" in refused(HOOK_SECRET, odd_stamp, body, signed_at)


def test_signatures_are_standard_webhooks_ones():
    """The scheme's published example, so any Standard Webhooks library verifies oncebox's."""
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    body = b'{"test": 2432232314}'
    at = datetime.fromtimestamp(1614265330, UTC)
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    assert verify_webhook(secret, headers, body, now=at) == {"test": 2432232314}


def test_a_receiver_refuses_a_request_signed_too_long_ago(receiver):
    signed_at = datetime(2020, 1, 1, tzinfo=UTC)
    outcome = send_once(hook_url(receiver), now=lambda: signed_at)
    assert isinstance(outcome, SendPermanent) and "HTTP 401" in outcome.reason, outcome
    assert receiver.received == [] and len(receiver.refused) == 1
    assert "old, beyond the tolerance" in receiver.refused[0]


def test_a_500_then_a_200_is_retried_and_processed_once(receiver, hook_box):
    box = hook_box(hook_url(receiver))
    receiver.script("500")
    with FrozenClock(box, at=T0) as clock:
        enqueue(box, [1])
        assert drain(box).dispatched.retried == 1
        assert (row(box, 1).state, row(box, 1).attempt) == ("pending", 1)
        clock.set(row(box, 1).next_attempt_at)
        assert drain(box).dispatched.sent == 1
    assert receiver.ids() == [webhook_id(1)] * 2  # the same id on the retry
    assert receiver.processed == [webhook_id(1)]


def test_a_429_pauses_the_whole_channel_until_retry_after(receiver, hook_box):
    box = hook_box(hook_url(receiver))
    receiver.script("429:30")
    with FrozenClock(box, at=T0) as clock:
        enqueue(box, [1, 2])
        first = drain(box)
        assert (first.dispatched.throttled, first.dispatched.waited) == (1, 1)
        assert [row(box, n).attempt for n in (1, 2)] == [0, 0]  # waits spend nothing
        clock.advance(timedelta(seconds=29))
        assert drain(box).dispatched.sent == 0
        assert len(receiver.received) == 1  # nobody posted while paused
        clock.advance(timedelta(seconds=1))
        assert drain(box).dispatched.sent == 2
    assert sorted(receiver.processed) == sorted([webhook_id(1), webhook_id(2)])


def test_without_receivers_dedupe_a_timeout_after_the_request_was_written_is_held(
    receiver, hook_box
):
    box = hook_box(hook_url(receiver, "allow=127.0.0.1&timeout=0.5"))
    assert (box.channels["hooks"].idempotent, box.channels["hooks"].window) == (False, None)
    receiver.script("accept-then-timeout:5")
    with FrozenClock(box, at=T0) as clock:
        enqueue(box, [1])
        result = drain(box, raise_on_failure=False)
        assert result.dispatched.ambiguous == 1
        held = row(box, 1)
        assert held.state == "ambiguous", held
        assert "ReadTimeout" in held.last_error and "held for reconciliation" in held.last_error
        clock.advance(timedelta(hours=1))
        assert drain(box, raise_on_failure=False).dispatched.leased == 0
    assert receiver.ids() == [webhook_id(1)]  # it had arrived; nothing was sent again


def test_under_policy_retry_a_timeout_is_resent_and_counted_as_a_possible_duplicate(
    receiver, hook_box
):
    box = hook_box(hook_url(receiver, "allow=127.0.0.1&timeout=0.5"), ambiguity="retry")
    receiver.script("accept-then-timeout:5")
    with FrozenClock(box, at=T0) as clock:
        enqueue(box, [1])
        assert drain(box).dispatched.possible_duplicates == 1
        clock.set(row(box, 1).next_attempt_at)
        assert drain(box).dispatched.sent == 1
    assert receiver.ids() == [webhook_id(1)] * 2  # a receiver that dedupes can still tell
    assert row(box, 1).possible_duplicates == 1


def test_with_receivers_dedupe_a_timeout_is_resent_under_the_same_webhook_id(hook_box):
    with WebhookReceiver(HOOK_SECRET, dedupe=True) as receiver:
        box = hook_box(hook_url(receiver, "allow=127.0.0.1&timeout=0.5&receivers_dedupe=true"))
        assert (box.channels["hooks"].idempotent, box.channels["hooks"].window) == (True, None)
        receiver.script("accept-then-timeout:5")
        with FrozenClock(box, at=T0) as clock:
            enqueue(box, [1])
            assert drain(box).dispatched.retried == 1  # unknown outcome: resent, same id
            assert row(box, 1).state == "pending"
            clock.set(row(box, 1).next_attempt_at)
            assert drain(box).dispatched.sent == 1
        assert receiver.ids() == [webhook_id(1)] * 2
        assert (receiver.processed, receiver.repeats) == ([webhook_id(1)], 1)
    outcomes = [a.outcome for a in box.store.delivery_attempt_list(row(box, 1).id)]
    assert outcomes == ["ambiguous", "sent"]


def test_a_target_resolving_to_a_private_address_is_dead_with_the_address_named(receiver, hook_box):
    hooks = WebhookProvider(
        f"webhook+https://hooks.acme.example/in?secret_env={SECRET_ENV}",
        resolve=resolving_to(["10.20.30.40"]),
    )
    box = hook_box(hooks)
    enqueue(box, [1])
    result = drain(box, raise_on_failure=False)
    dead = row(box, 1)
    assert (result.dispatched.dead, dead.state) == (1, "dead")
    assert "hooks.acme.example is 10.20.30.40, a private address" in dead.last_error


def test_a_payload_that_is_too_large_fails_its_handler_and_writes_nothing(receiver, hook_box):
    box = hook_box(hook_url(receiver))
    enqueue(box, [1], size=MAX_WEBHOOK_BYTES)
    result = drain(box, raise_on_failure=False)
    assert result.failures and f"at most {MAX_WEBHOOK_BYTES} bytes" in result.failures[0].error
    assert box.store.outbox_find_by_key(key(1)) == []


def test_without_a_signing_secret_the_channel_waits_and_sends_nothing_unsigned(
    receiver, hook_box, monkeypatch
):
    monkeypatch.delenv(SECRET_ENV)
    box = hook_box(hook_url(receiver))
    enqueue(box, [1])
    result = drain(box)
    assert result.dispatched.throttled == 1
    waiting = row(box, 1)
    assert (waiting.state, waiting.attempt) == ("pending", 0)
    assert f"no signing secret in ${SECRET_ENV}" in waiting.last_error
    assert receiver.received == [] and receiver.refused == []


# -- each answer, classified ---------------------------------------------------------------------

ANSWERS: list[tuple[str, type, str]] = [
    ("408", SendRetryable, "HTTP 408"),
    ("425", SendRetryable, "HTTP 425"),
    ("500", SendRetryable, "HTTP 500"),
    ("503:120", SendRetryable, "HTTP 503"),
    ("429:30", SendThrottled, "HTTP 429"),
    ("400", SendPermanent, "HTTP 400"),
    ("401", SendPermanent, "check the signing secret"),
    ("404", SendPermanent, "HTTP 404"),
    ("409", SendPermanent, "HTTP 409"),
    ("410", SendPermanent, "endpoint is gone"),
    ("422", SendPermanent, "HTTP 422"),
    ("accept-then-reset", SendAmbiguous, "may have been received"),
]


@pytest.mark.parametrize(("action", "expected", "said"), ANSWERS, ids=[a for a, _, _ in ANSWERS])
def test_every_answer_is_classified(receiver, action, expected, said):
    receiver.script(action)
    outcome = send_once(hook_url(receiver))
    assert type(outcome) is expected, outcome
    assert isinstance(outcome, SendError) and said in outcome.reason
    assert HOOK_SECRET not in outcome.reason and "/hook" not in outcome.reason
    if action in ("503:120", "429:30"):
        wait = int(action.partition(":")[2])
        assert outcome.retry_after == timedelta(seconds=wait)  # type: ignore[attr-defined]


def test_a_refused_connection_is_retryable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome = send_once(f"webhook+http://127.0.0.1:{port}/hook?allow=127.0.0.1")
    assert isinstance(outcome, SendRetryable) and "ConnectError" in outcome.reason, outcome


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed(status):
    with (
        WebhookReceiver(HOOK_SECRET) as first,
        WebhookReceiver(HOOK_SECRET) as elsewhere,
    ):
        target = f"http://127.0.0.1:{elsewhere.port}/stolen"
        first.script(f"{status}:{target}")
        outcome = send_once(hook_url(first))
        assert isinstance(outcome, SendPermanent), outcome
        assert f"HTTP {status} redirect to {target} not followed" in outcome.reason
        assert (len(first.received), elsewhere.received) == (1, [])


@contextmanager
def canned(status: int, body: bytes) -> Iterator[int]:
    """A one-answer server on loopback (any body, signatures unchecked); its port."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            with contextlib.suppress(OSError):  # the client stops reading at its cap
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_reply_is_read_only_up_to_its_cap_and_quoted_inert():
    hostile = b"\x1b]0;owned\x07\x1b[2J" + b"A" * (8 * 1024 * 1024)
    with canned(500, hostile) as port:
        outcome = send_once(f"webhook+http://127.0.0.1:{port}/hook?allow=127.0.0.1")
    assert isinstance(outcome, SendRetryable), outcome
    assert "\x1b" not in outcome.reason and "\\x1b]0;owned\\x07" in outcome.reason
    assert len(outcome.reason) < 400
    with canned(200, b'{"id": "\\u001b[31mrcv-9"}') as port:
        receipt = send_once(f"webhook+http://127.0.0.1:{port}/hook?allow=127.0.0.1")
    assert isinstance(receipt, Receipt) and receipt.provider_id == "\\x1b[31mrcv-9"
    with canned(204, b"") as port:
        empty = send_once(f"webhook+http://127.0.0.1:{port}/hook?allow=127.0.0.1")
    assert isinstance(empty, Receipt) and (empty.provider_id, empty.detail) == (None, "HTTP 204")


# -- where a webhook may go ----------------------------------------------------------------------

REFUSED: list[tuple[str, str]] = [
    ("127.0.0.1", "a loopback address"),
    ("10.1.2.3", "a private address"),
    ("172.16.5.4", "a private address"),
    ("192.168.1.1", "a private address"),
    ("169.254.169.254", "a link-local address (cloud metadata)"),
    ("0.0.0.0", "an unspecified address"),  # noqa: S104 (refused, not bound)
    ("100.64.0.1", "a special-purpose address"),
    ("224.0.0.251", "a multicast address"),
    ("::1", "a loopback address"),
    ("::", "an unspecified address"),
    ("::ffff:127.0.0.1", "127.0.0.1 inside an IPv6 address, a loopback address"),
    ("::ffff:169.254.169.254", "169.254.169.254 inside an IPv6 address, a link-local address"),
    ("2002:a00:1::", "10.0.0.1 inside an IPv6 address, a private address"),  # 6to4
    ("64:ff9b::a9fe:a9fe", "169.254.169.254 inside an IPv6 address, a link-local"),  # NAT64
    ("fc00::1", "a private address"),
    ("fe80::1", "a link-local address"),
    ("fec0::1", "a site-local address"),
    ("ff02::1", "a multicast address"),
]


@pytest.mark.parametrize(("address", "why"), REFUSED, ids=[a for a, _ in REFUSED])
def test_an_https_target_resolving_to_an_internal_address_is_refused(address, why):
    resolve = resolving_to([address])
    url = f"webhook+https://hooks.acme.example/in?secret_env={SECRET_ENV}"
    outcome = send_once(url, resolve=resolve)
    assert isinstance(outcome, SendPermanent), outcome
    assert f"hooks.acme.example is {address}, {why}" in outcome.reason
    assert "?allow=" in outcome.reason and "\n" not in outcome.reason


def test_every_resolved_address_is_checked_not_only_the_first():
    resolve = resolving_to(["93.184.215.14", "10.0.0.1"])
    url = f"webhook+https://hooks.acme.example/in?secret_env={SECRET_ENV}"
    outcome = send_once(url, resolve=resolve)
    assert isinstance(outcome, SendPermanent) and "is 10.0.0.1, a private" in outcome.reason


@pytest.mark.parametrize("host", ["localhost", "2130706433", "127.1", "0x7f000001"])
def test_names_the_system_resolver_turns_into_loopback_are_refused(host):
    outcome = send_once(f"webhook+https://{host}/in?secret_env={SECRET_ENV}")
    assert isinstance(outcome, SendPermanent), outcome
    assert "loopback address" in outcome.reason


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1", "is a loopback address"),
        ("169.254.169.254", "is a link-local address (cloud metadata)"),
        ("[::ffff:127.0.0.1]", "is 127.0.0.1 inside an IPv6 address, a loopback address"),
        ("0.0.0.0", "is an unspecified address"),  # noqa: S104 (refused, not bound)
        ("[fd00:ec2::254]", "is a private address"),
    ],
)
def test_an_internal_ip_literal_is_refused_when_the_channel_is_declared(host, why):
    with pytest.raises(ConfigurationError, match=re.escape(why)):
        from_url(f"webhook+https://{host}/latest/meta-data")


def test_plain_http_is_refused_unless_the_target_is_allow_listed(receiver):
    with pytest.raises(ConfigurationError, match="only for an allow-listed target"):
        from_url("webhook+http://hooks.acme.example/in")
    public = resolving_to(["93.184.215.14"])
    outcome = send_once("webhook+http://hooks.acme.example/in?allow=10.0.0.0/8", resolve=public)
    assert isinstance(outcome, SendPermanent), outcome
    assert "webhook+http:// is only for an allow-listed target" in outcome.reason
    # every address inside an allowed network: plain HTTP is fine
    loopback = resolving_to(["127.0.0.1"])
    url = f"webhook+http://hooks.internal:{receiver.port}/hook?allow=127.0.0.0/8"
    assert isinstance(send_once(url, resolve=loopback), Receipt)
    assert receiver.ids() == [WEBHOOK_ID]


def test_the_checked_address_itself_is_connected_to_with_the_hostname_as_host(receiver):
    resolve = resolving_to(["127.0.0.1"])
    url = f"webhook+http://hooks.internal:{receiver.port}/hook?allow=hooks.internal"
    assert isinstance(send_once(url, resolve=resolve), Receipt)
    [got] = receiver.received
    assert got.host == f"hooks.internal:{receiver.port}"
    assert resolve.lookups == [("hooks.internal", receiver.port)]  # type: ignore[attr-defined]


def test_each_send_resolves_again_so_a_rebound_name_is_refused(receiver):
    resolve = resolving_to(["127.0.0.1"], ["10.0.0.7"])
    url = f"webhook+http://hooks.internal:{receiver.port}/hook?allow=127.0.0.0/8"
    with provider(url, resolve=resolve) as hooks:
        assert isinstance(hooks.send(OUTGOING, WEBHOOK_ID), Receipt)
        with pytest.raises(SendPermanent, match=re.escape("hooks.internal is 10.0.0.7, a private")):
            hooks.send(OUTGOING, WEBHOOK_ID)
    assert receiver.ids() == [WEBHOOK_ID]


def test_an_address_that_refuses_the_connection_gives_way_to_the_next_checked_one(receiver):
    resolve = resolving_to(["127.0.0.2", "127.0.0.1"])  # the receiver listens on .1 only
    url = f"webhook+http://hooks.internal:{receiver.port}/hook?allow=127.0.0.0/8"
    assert isinstance(send_once(url, resolve=resolve), Receipt)
    assert receiver.ids() == [WEBHOOK_ID]


def tls_contexts(tmp_path: Path, name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for `name` from a fresh CA, and a client context
    trusting that CA only (cryptography comes with the dev dependencies, through moto)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    start, end = datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC)
    ca_key, leaf_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "oncebox test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(2)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    chain, private = tmp_path / "leaf.pem", tmp_path / "leaf.key"
    chain.write_bytes(leaf.public_bytes(pem))
    private.write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(chain, private)
    client = ssl.create_default_context(cadata=ca.public_bytes(pem).decode())
    return server, client


def test_https_to_the_pinned_address_verifies_the_certificate_of_the_hostname(tmp_path):
    server, client = tls_contexts(tmp_path, "hooks.internal")
    with WebhookReceiver(HOOK_SECRET, tls=server) as receiver:
        url = (
            f"webhook+https://hooks.internal:{receiver.port}/hook"
            f"?secret_env={SECRET_ENV}&allow=hooks.internal"
        )
        assert isinstance(
            send_once(url, resolve=resolving_to(["127.0.0.1"]), verify=client), Receipt
        )
        assert receiver.server_names == ["hooks.internal"]  # SNI: the name, not the address
        assert receiver.received[0].host == f"hooks.internal:{receiver.port}"
        # the same address under a name the certificate does not hold: no connection
        other = url.replace("hooks.internal", "other.internal")
        outcome = send_once(other, resolve=resolving_to(["127.0.0.1"]), verify=client)
        assert isinstance(outcome, SendRetryable) and "CERTIFICATE_VERIFY_FAILED" in outcome.reason
        assert len(receiver.received) == 1


# -- declarations ---------------------------------------------------------------------------------


def test_receivers_dedupe_declares_the_channel_idempotent_for_as_long_as_they_remember():
    cases = {
        "": (False, None),
        "&receivers_dedupe=false": (False, None),
        "&receivers_dedupe=true": (True, None),
        "&receivers_dedupe=true&dedupe_hours=72": (True, timedelta(hours=72)),
    }
    for options, expected in cases.items():
        hooks = from_url(f"webhook+https://hooks.acme.example/in?timeout=5{options}")
        assert (hooks.name, hooks.idempotent, hooks.idempotency_window) == ("webhook", *expected)
        assert isinstance(hooks, WebhookProvider) and hooks.where == "https://hooks.acme.example"
        hooks.close()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("webhook+ftp://hooks.acme.example/in", "not supported"),
        ("webhook+https://user:pw-secret@hooks.acme.example/in", "no credentials in the URL"),
        ("webhook+https://hooks.acme.example/in?secret=pw-secret", "unknown option"),
        ("webhook+https:///in", "names no host"),
        ("webhook+https://hooks.acme.example/in?receivers_dedupe=maybe", "true or false"),
        ("webhook+https://hooks.acme.example/in?dedupe_hours=24", "needs receivers_dedupe"),
        ("webhook+https://hooks.acme.example/in?allow=10.0.0.0/33", "not a network"),
        ("webhook+https://hooks.acme.example/in?allow=bad_host!", "not a hostname"),
        ("webhook+https://hooks.acme.example/in?timeout=0", "timeout"),
        ("webhook+https://hooks.acme.example:99999/in", "port 99999 is not a port"),
        ("webhook+https://[hooks.acme.example/in", "is malformed"),
    ],
)
def test_bad_webhook_urls_are_refused_when_declared(url, why):
    with pytest.raises(ConfigurationError, match=why) as caught:
        from_url(url)
    assert "pw-secret" not in str(caught.value)


def test_a_short_secret_is_refused_naming_its_variable_not_its_value(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "short-secret")
    with pytest.raises(
        ConfigurationError, match=f"{SECRET_ENV}: the webhook secret is 12 bytes"
    ) as caught:
        from_url(f"webhook+https://hooks.acme.example/in?secret_env={SECRET_ENV}")
    assert "short-secret" not in str(caught.value)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (["not", "an", "object"], "is a JSON object"),
        ({"amount": float("nan")}, "must be JSON"),
        ({"when": datetime(2026, 1, 1, tzinfo=UTC)}, "must be JSON"),
        ({"pad": "x" * MAX_WEBHOOK_BYTES}, f"at most {MAX_WEBHOOK_BYTES} bytes"),
    ],
)
def test_a_payload_that_cannot_be_a_webhook_body_is_refused_when_written(payload, why):
    with provider("webhook+https://hooks.acme.example/in") as hooks:
        with pytest.raises(InvalidArguments, match=why):
            hooks.check_payload(payload)
        hooks.check_payload({"type": "order.shipped", "order": 1})
