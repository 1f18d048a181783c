"""SMTP credentials cross the wire only inside TLS: implicit TLS (`smtps://`, port 465) or
STARTTLS, required whenever the URL holds credentials; plain AUTH only to a loopback peer or with
`?insecure_auth=1`. Servers run on this machine's own non-loopback address where the rule for
other hosts is the point (the client then sees a peer that is not loopback)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from oncebox import Box
from oncebox.fakes.smtp_sink import SmtpSink
from oncebox.kernel.errors import ConfigurationError
from oncebox.outbox.tokens import derive_token
from oncebox.providers import from_url
from oncebox.providers.smtp import SmtpProvider
from oncebox.testing import drain
from support.addresses import non_loopback_address
from support.outbox import SECRET, enqueue_customers
from support.raw_smtp import RecordingSmtp
from support.tls import self_signed

PASSWORD = "s3cret-pw-0451"


def token(customer: int) -> str:
    return derive_token(SECRET, f"weekly-digest/customer-{customer}/2026-W33")


def row(box, customer: int):
    [found] = box.store.outbox_find_by_key(f"weekly-digest/customer-{customer}/2026-W33")
    return found


def credential_forms() -> list[bytes]:
    """How the password could appear on the wire: as itself, or inside AUTH PLAIN's or AUTH
    LOGIN's base64."""
    plain = base64.b64encode(f"\0mailer\0{PASSWORD}".encode())
    return [PASSWORD.encode(), plain, base64.b64encode(PASSWORD.encode())]


@pytest.fixture(scope="module")
def outside() -> str:
    address = non_loopback_address()
    if address is None:
        pytest.skip(
            "NO NON-LOOPBACK ADDRESS on this machine: the rule for SMTP hosts that are not "
            "loopback cannot be exercised here"
        )
    return address


@pytest.fixture(scope="module")
def certificate(tmp_path_factory, outside):
    return self_signed(tmp_path_factory.mktemp("smtp-tls"), outside, "127.0.0.1")


@pytest.mark.parametrize("option", ["", "&starttls=0"], ids=["default", "starttls=0"])
def test_credentials_never_cross_a_plain_connection_to_a_host_that_is_not_loopback(
    outside, option, sqlite_url, mail_box
):
    server = RecordingSmtp(outside)  # offers AUTH, no STARTTLS: as if an attacker stripped it
    try:
        url = f"smtp://mailer:{PASSWORD}@{outside}:{server.port}?timeout=5{option}"
        box = mail_box(sqlite_url, url)
        enqueue_customers(box, [1])
        result = drain(box, raise_on_failure=False)
        transcript = server.transcript()
        assert server.connected.is_set(), "the provider never reached the server"
        commands = [line.upper() for line in transcript.splitlines()]
        assert not [c for c in commands if c.startswith(b"AUTH")], transcript
        leaked = [form for form in credential_forms() if form in transcript]
        assert leaked == [], transcript
        assert server.received == 0
        # the channel's configuration is wrong, not the message: the channel pauses, no attempt
        assert (result.dispatched.throttled, row(box, 1).attempt) == (1, 0)
        error = row(box, 1).last_error
        assert f"{outside}:{server.port}" in error and "STARTTLS" in error, error
        assert PASSWORD not in error
    finally:
        server.close()


def logged_in_url(scheme: str, sink: SmtpSink, cert: Path) -> str:
    """The sink's URL with the user `mailer`, its password from the environment, the test CA."""
    return (
        f"{scheme}://mailer@{sink.host}:{sink.port}?cafile={cert}"
        "&password_env=SMTP_TEST_PASSWORD&timeout=5"
    )


def sends_one_logged_in(box: Box, sink: SmtpSink) -> None:
    """One message sent through `box`, reaching `sink` after a login as `mailer`."""
    enqueue_customers(box, [1])
    assert drain(box).dispatched.sent == 1
    assert sink.tokens() == [token(1)]
    assert sink.logins == ["mailer"]
    box.close()


def test_credentials_go_inside_starttls_by_default_to_a_host_that_is_not_loopback(
    outside, certificate, sqlite_url, mail_box, monkeypatch
):
    cert, key = certificate
    monkeypatch.setenv("SMTP_TEST_PASSWORD", PASSWORD)
    sink = SmtpSink(host=outside, tls_cert=str(cert), tls_key=str(key), login=("mailer", PASSWORD))
    with sink:  # the sink answers 530 to anything but STARTTLS before TLS
        sends_one_logged_in(mail_box(sqlite_url, logged_in_url("smtp", sink, cert)), sink)


def test_implicit_tls_carries_credentials_to_a_host_that_is_not_loopback(
    outside, certificate, sqlite_url, mail_box, monkeypatch
):
    cert, key = certificate
    monkeypatch.setenv("SMTP_TEST_PASSWORD", PASSWORD)
    sink = SmtpSink(
        host=outside,
        tls_cert=str(cert),
        tls_key=str(key),
        implicit_tls=True,
        login=("mailer", PASSWORD),
    )
    with sink:
        sends_one_logged_in(mail_box(sqlite_url, logged_in_url("smtps", sink, cert)), sink)


def test_plain_auth_to_a_loopback_server_still_works(sqlite_url, mail_box):
    server = RecordingSmtp("127.0.0.1")
    try:
        box = mail_box(sqlite_url, f"smtp://mailer:{PASSWORD}@127.0.0.1:{server.port}?timeout=5")
        enqueue_customers(box, [1])
        assert drain(box).dispatched.sent == 1
        assert b"AUTH PLAIN" in server.transcript()  # in the clear, but it never left the host
        box.close()
    finally:
        server.close()


def test_insecure_auth_allows_plain_auth_to_a_host_that_is_not_loopback(
    outside, sqlite_url, mail_box
):
    server = RecordingSmtp(outside)
    try:
        url = f"smtp://mailer:{PASSWORD}@{outside}:{server.port}?timeout=5&insecure_auth=1"
        box = mail_box(sqlite_url, url)
        enqueue_customers(box, [1])
        assert drain(box).dispatched.sent == 1
        assert b"AUTH PLAIN" in server.transcript()
        box.close()
    finally:
        server.close()


def test_port_465_speaks_tls_from_the_first_byte():
    assert isinstance(implicit := from_url("smtp://mx.example:465"), SmtpProvider)
    assert implicit.implicit_tls
    assert isinstance(submission := from_url("smtp://mx.example:587"), SmtpProvider)
    assert not submission.implicit_tls
    assert isinstance(smtps := from_url("smtps://mx.example"), SmtpProvider)
    assert (smtps.implicit_tls, smtps.port) == (True, 465)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("smtp://u:pw-secret@mx.example:587?tls=1", "unknown option(s) tls"),
        ("smtp://u:pw-secret@mx.example:587?starttls=1&insecure=1", "unknown option(s) insecure"),
        ("smtps://u:pw-secret@mx.example?starttls=1", "starttls=1 with implicit TLS"),
        ("smtp://u:pw-secret@mx.example:465?starttls=1", "starttls=1 with implicit TLS"),
        ("smtp://u:pw-secret@mx.example:587?starttls=maybe", "starttls='maybe' must be"),
        ("smtp://u:pw-secret@mx.example:587?insecure_auth=2", "insecure_auth='2' must be"),
    ],
)
def test_bad_smtp_options_are_refused_in_one_line_without_the_password(url, needle):
    with pytest.raises(ConfigurationError) as refused:
        from_url(url)
    message = str(refused.value)
    assert needle in message, message
    assert "pw-secret" not in message and "\n" not in message, message
