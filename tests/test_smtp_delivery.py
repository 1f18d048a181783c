"""Delivery through a real SMTP server (aiosmtpd on loopback), told how to answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oncebox.fakes.smtp_sink import SmtpSink
from oncebox.outbox.tokens import derive_token
from oncebox.testing import FrozenClock, drain
from support.outbox import SECRET, enqueue_customers

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


def key(customer: int) -> str:
    return f"weekly-digest/customer-{customer}/2026-W33"


def token(customer: int) -> str:
    return derive_token(SECRET, key(customer))


def row(box, customer: int):
    [found] = box.store.outbox_find_by_key(key(customer))
    return found


@pytest.fixture
def sink():
    with SmtpSink() as server:
        yield server


def test_each_message_arrives_once_with_a_stable_token_and_no_raw_key(sink, store_url, mail_box):
    box = mail_box(store_url, sink.url)
    enqueue_customers(box, [1, 2, 3])
    assert drain(box).dispatched.sent == 3
    assert sorted(sink.tokens()) == sorted(token(c) for c in (1, 2, 3))
    mail = next(m for m in sink.received if m.token == token(1))
    assert mail.message_id == f"<{token(1)}@oncebox.example>"
    assert mail.rcpt_tos == ("customer-1@freight.example",)
    assert key(1) not in mail.message.as_string()
    assert row(box, 1).state == "sent"


def test_a_451_is_retried_for_that_message_while_the_channel_keeps_sending(
    sink, store_url, mail_box
):
    box = mail_box(store_url, sink.url)
    sink.script("451 4.7.1 greylisted, try later", token=token(2))
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1, 2, 3])
        first = drain(box)
        assert (first.dispatched.sent, first.dispatched.retried) == (2, 1)
        greylisted = row(box, 2)
        assert (greylisted.state, greylisted.attempt) == ("pending", 1)
        assert "451" in greylisted.last_error
        clock.set(greylisted.next_attempt_at)
        assert drain(box).dispatched.sent == 1
    assert sorted(sink.tokens()) == sorted(token(c) for c in (1, 2, 3))  # each once


def test_a_421_pauses_the_channel_without_spending_attempts(sink, store_url, mail_box):
    box = mail_box(store_url, sink.url, pause_on_421=timedelta(minutes=5))
    sink.script("421 4.3.2 too many connections")
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1, 2, 3])
        first = drain(box)
        assert (first.dispatched.sent, first.dispatched.throttled) == (0, 1)
        assert first.dispatched.waited == 2  # the rest of the batch, given back untouched
        assert [row(box, c).attempt for c in (1, 2, 3)] == [0, 0, 0]
        clock.advance(timedelta(minutes=4, seconds=59))
        assert drain(box).dispatched.sent == 0  # still paused, for every dispatcher
        clock.advance(timedelta(seconds=1))
        assert drain(box).dispatched.sent == 3
    assert sorted(sink.tokens()) == sorted(token(c) for c in (1, 2, 3))


def test_a_550_is_dead_with_the_reply_and_a_replay_resends_the_same_message(
    sink, store_url, mail_box
):
    box = mail_box(store_url, sink.url)
    sink.script("550 5.1.1 no such user", token=token(1))
    enqueue_customers(box, [1])
    result = drain(box, raise_on_failure=False)
    dead = row(box, 1)
    assert (result.dispatched.dead, dead.state, dead.attempt) == (1, "dead", 1)
    assert "550 at end of data: 5.1.1 no such user" in dead.last_error
    attempts = box.store.delivery_attempt_list(dead.id)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "dead")]
    assert sink.received == []
    replayed = box.replay(key(1), reason="the address was fixed at the provider", actor="ops")
    assert (replayed.kind, replayed.id) == ("delivery", dead.id)
    assert drain(box).dispatched.sent == 1
    assert sink.tokens() == [token(1)]
    assert sink.received[0].message["Subject"] == "Your shipments, 2026-W33"
    history = [(a.attempt, a.outcome) for a in box.store.delivery_attempt_list(dead.id)]
    assert history == [(1, "dead"), (2, "sent")]
    assert [a.action for a in box.store.audit_list(target_id=dead.id)] == ["replay"]


def test_a_lost_acknowledgement_under_hold_is_ambiguous_and_never_resent(sink, store_url, mail_box):
    box = mail_box(store_url, sink.url)  # ambiguity="hold" is the default
    sink.script("drop", token=token(1))
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        result = drain(box, raise_on_failure=False)
        assert result.dispatched.ambiguous == 1
        held = row(box, 1)
        assert held.state == "ambiguous" and "may have been accepted" in held.last_error
        clock.advance(timedelta(days=2))
        assert drain(box, raise_on_failure=False).dispatched.leased == 0  # nothing resent
        assert sink.tokens() == [token(1)]  # delivered once, by the server's own record
        box.resolve(key(1), "sent", reason="the recipient confirmed", actor="ops")
    assert row(box, 1).state == "sent"
    assert [a.action for a in box.store.audit_list(target_id=held.id)] == ["resolve-sent"]


def test_a_lost_acknowledgement_under_retry_resends_once_and_reports_it(sink, store_url, mail_box):
    box = mail_box(store_url, sink.url, ambiguity="retry")
    sink.script("drop", token=token(1))
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        first = drain(box)
        assert (first.dispatched.retried, first.dispatched.possible_duplicates) == (1, 1)
        clock.set(row(box, 1).next_attempt_at)
        assert drain(box).dispatched.sent == 1
    assert sink.tokens() == [token(1), token(1)]  # one extra delivery, at most
    final = row(box, 1)
    assert (final.state, final.possible_duplicates) == ("sent", 1)


def test_an_unreachable_server_is_retried_not_ambiguous(store_url, mail_box):
    box = mail_box(store_url, "smtp://127.0.0.1:1?timeout=2")
    with FrozenClock(box, at=T0):
        enqueue_customers(box, [1])
        result = drain(box)
    assert result.dispatched.retried == 1
    assert row(box, 1).state == "pending"


def test_a_worker_runs_consumers_and_the_dispatcher_together(sink, store_url, mail_box):
    from oncebox import WorkerConfig

    box = mail_box(store_url, sink.url)
    for round_ in range(4):  # until_idle must not stop before the dispatcher saw the new rows
        enqueue_customers(box, range(round_ * 25, round_ * 25 + 25))
        result = box.work(config=WorkerConfig(concurrency=2, until_idle=True))
        assert (result.consumed.completed, result.dispatched.sent) == (25, 25), round_
    assert len(set(sink.tokens())) == 100 == len(sink.tokens())


def test_a_connection_the_server_dropped_while_idle_is_replaced(store_url, mail_box):
    first = SmtpSink().start()
    box = mail_box(store_url, first.url)
    enqueue_customers(box, [1])
    dispatcher = box.dispatcher()
    drain(box, dispatch=False)
    assert dispatcher.run_once().sent == 1
    first.stop()  # the server restarts; the dispatcher's open connection is now dead
    with SmtpSink(port=first.port) as second:
        enqueue_customers(box, [2])
        drain(box, dispatch=False)
        result = dispatcher.run_once()
        assert (result.sent, result.retried) == (1, 0)  # reconnected, not a failed attempt
        assert second.tokens() == [token(2)]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    import subprocess

    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_starttls_and_authentication(certificate, sqlite_url, mail_box, monkeypatch):
    cert, key = certificate
    monkeypatch.setenv("SMTP_TEST_PASSWORD", "s3cret")
    with SmtpSink(tls_cert=str(cert), tls_key=str(key), login=("mailer", "s3cret")) as server:
        url = (
            f"smtp://mailer@{server.host}:{server.port}?starttls=1&cafile={cert}"
            "&password_env=SMTP_TEST_PASSWORD&timeout=5"
        )
        box = mail_box(sqlite_url, url)
        enqueue_customers(box, [1])
        assert drain(box).dispatched.sent == 1
        assert server.tokens() == [token(1)]
        monkeypatch.setenv("SMTP_TEST_PASSWORD", "wrong")
        wrong = mail_box(sqlite_url.replace("oncebox.db", "other.db"), url)
        enqueue_customers(wrong, [2])
        result = drain(wrong, raise_on_failure=False)
        assert (result.dispatched.sent, result.dispatched.throttled) == (0, 1)  # channel paused
        assert server.tokens() == [token(1)]
        box.close()  # before the server stops, so no connection outlives it
        wrong.close()


def test_an_idle_timeout_421_on_a_reused_connection_is_not_a_channel_pause(sqlite_url, mail_box):
    from support.raw_smtp import IdleTimeoutSmtp

    server = IdleTimeoutSmtp()
    try:
        box = mail_box(sqlite_url, f"smtp://127.0.0.1:{server.port}?timeout=5")
        dispatcher = box.dispatcher()
        enqueue_customers(box, [1])
        drain(box, dispatch=False)
        assert dispatcher.run_once().sent == 1
        server.time_out_idle_clients()  # the server's 421 waits in the idle connection
        enqueue_customers(box, [2])
        drain(box, dispatch=False)
        result = dispatcher.run_once()
        assert (result.sent, result.throttled) == (1, 0)
        assert (server.received, server.connections) == (2, 2)
        box.close()
    finally:
        server.close()


def test_a_server_without_starttls_pauses_the_channel_and_spends_nothing(
    sink, sqlite_url, mail_box
):
    box = mail_box(sqlite_url, f"{sink.url}&starttls=1")
    with FrozenClock(box, at=T0):
        enqueue_customers(box, [1])
        result = drain(box, raise_on_failure=False)
    assert (result.dispatched.throttled, row(box, 1).attempt) == (1, 0)
    assert "STARTTLS" in row(box, 1).last_error
    assert sink.received == []
