"""Writing to the outbox, on every store: rows commit with the claim, frozen, keyed by intent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import Box, Retry
from oncebox.outbox.tokens import derive_token
from oncebox.testing import FrozenClock, MemoryProvider, drain, outbox_sent
from support.db import create_effects, effects, record_effect
from support.outbox import SECRET, enqueue_customers

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
KEY = "weekly-digest/customer-1/2026-W33"


def test_a_handlers_email_commits_with_its_claim_and_is_sent_once(store_url, mail_box):
    memory = MemoryProvider()
    box = mail_box(store_url, memory)
    enqueue_customers(box, [1, 2])
    result = drain(box)
    assert (result.completed, result.dispatched.sent) == (2, 2)
    [row] = box.store.outbox_find_by_key(KEY)
    assert (row.key, row.intent_key, row.state, row.attempt) == (KEY, KEY, "sent", 1)
    assert row.token == derive_token(SECRET, KEY)  # derived from the key, never the key itself
    sent = outbox_sent(box, KEY)
    assert sent[0]["to"] == ["customer-1@freight.example"]
    assert KEY not in json.dumps([m for m in memory.messages()])
    again = drain(box)
    assert again.dispatched.leased == 0


def test_a_failing_handler_writes_no_outbox_row(store_url, open_box):
    box = open_box(store_url, secret=SECRET)
    box.channel("email", provider=MemoryProvider())

    @box.task(key="k/{n}", retry=Retry(max_attempts=1))
    def flaky(ctx, n: int) -> None:
        ctx.outbox.email(to="a@b.example", subject="s", text="t")
        if n == 2:
            raise RuntimeError("rendering failed")

    for n in (1, 2, 3):
        box.enqueue(flaky, n=n)
    result = drain(box, raise_on_failure=False)
    assert (result.completed, result.dead) == (2, 1)
    assert [r.key for n in (1, 2, 3) for r in box.store.outbox_find_by_key(f"k/{n}")] == [
        "k/1",
        "k/3",
    ]


def test_several_messages_of_one_intent_need_their_own_suffix(store_url, open_box):
    box = open_box(store_url, secret=SECRET)
    box.channel("email", provider=MemoryProvider())
    box.channel("ops", provider=MemoryProvider())

    @box.task(key="hold-expired/hold-{hold_id}")
    def expire(ctx, hold_id: int) -> None:
        ctx.outbox.email(to="customer@freight.example", subject="Your hold expired", text="t")
        ctx.outbox.email(to="dock@freight.example", subject="Hold freed", text="t", suffix="dock")
        ctx.outbox.add("ops", {"event": "hold-expired", "hold": hold_id}, suffix="ops")

    @box.task(key="twice/{n}", retry=Retry(max_attempts=1))
    def twice(ctx, n: int) -> None:
        ctx.outbox.email(to="a@b.example", subject="s", text="t")
        ctx.outbox.email(to="a@b.example", subject="s", text="t")

    box.enqueue(expire, hold_id=7)
    box.enqueue(twice, n=1)
    result = drain(box, raise_on_failure=False)
    rows = box.store.outbox_find_by_key("hold-expired/hold-7")
    assert sorted(r.key for r in rows) == [
        "hold-expired/hold-7",
        "hold-expired/hold-7~dock",
        "hold-expired/hold-7~ops",
    ]
    assert {r.channel for r in rows} == {"email", "ops"}
    assert result.failures[0].key == "twice/1"
    assert "give each further message of one intent its own suffix" in result.failures[0].error
    assert result.failures[0].final  # an outbox misuse is not retried


@pytest.mark.parametrize(
    ("write", "why"),
    [
        (lambda o: o.email(to="not an address", subject="s", text="t"), "not an address"),
        (lambda o: o.email(to="a@b.example", subject="two\nlines", text="t"), "one line"),
        (lambda o: o.email(to="a@b.example", subject="s"), "a text or an html body"),
        (
            lambda o: o.email(
                to="a@b.example", subject="s", text="t", headers={"Bcc": "x@y\r\nInjected: 1"}
            ),
            "one line of text",
        ),
        (
            lambda o: o.email(
                to="a@b.example", subject="s", text="t", headers={"Message-ID": "<mine@x>"}
            ),
            "set by oncebox",
        ),
        (lambda o: o.add("nope", {"a": 1}), "no channel named 'nope'"),
        (lambda o: o.add("email", {"a": float("nan")}), "not JSON"),
    ],
)
def test_bad_messages_are_refused_in_the_handler_and_dead_lettered(box: Box, write, why):
    box.channel("email", provider=MemoryProvider())

    @box.task(key="bad/{n}")
    def bad(ctx, n: int) -> None:
        write(ctx.outbox)

    box.enqueue(bad, n=1)
    result = drain(box, raise_on_failure=False)
    assert result.dead == 1 and why in result.failures[0].error
    assert box.store.outbox_find_by_key("bad/1") == []


def test_a_keyless_task_cannot_write_to_the_outbox(box: Box):
    box.channel("email", provider=MemoryProvider())

    @box.task
    def keyless(ctx, n: int) -> None:
        ctx.outbox.email(to="a@b.example", subject="s", text="t")

    box.enqueue(keyless, n=1)
    result = drain(box, raise_on_failure=False)
    assert "needs a task with a key template" in result.failures[0].error


def test_the_message_is_frozen_when_written(store_url, mail_box):
    """Every retry sends what the handler rendered, even if the data changed since."""
    memory = MemoryProvider()
    box = mail_box(store_url, memory)
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        memory.failures.append(__import__("oncebox").providers.SendRetryable("503 busy"))
        first = drain(box)
        assert (first.dispatched.retried, first.dispatched.sent) == (1, 0)
        written = box.store.outbox_find_by_key(KEY)[0].payload_json
        clock.advance(timedelta(hours=2))
        second = drain(box)
        assert second.dispatched.sent == 1
    assert json.loads(written)["date"] == "Mon, 17 Aug 2026 09:00:00 +0000"
    assert [m["date"] for m in memory.messages()] == ["Mon, 17 Aug 2026 09:00:00 +0000"]


def test_no_secret_means_no_outbox_row_and_a_clear_error(store_url, monkeypatch, open_box):
    monkeypatch.delenv("ONCEBOX_SECRET", raising=False)
    box = open_box(store_url)
    box.channel("email", provider=MemoryProvider())

    @box.task(key="k/{n}", retry=Retry(max_attempts=1))
    def k(ctx, n: int) -> None:
        ctx.outbox.email(to="a@b.example", subject="s", text="t")

    box.enqueue(k, n=1)
    result = drain(box, raise_on_failure=False)
    assert "set ONCEBOX_SECRET" in result.failures[0].error
    stored = box.init_secret()
    assert open_box(store_url).secret() == stored  # every worker on this database agrees


def test_writes_and_messages_of_one_handler_share_its_fate(store_url, open_box):
    box = open_box(store_url, secret=SECRET)
    box.channel("email", provider=MemoryProvider())
    create_effects(box)

    @box.task(key="k/{n}", retry=Retry(max_attempts=1))
    def both(ctx, n: int) -> None:
        record_effect(ctx, "row")
        ctx.outbox.email(to="a@b.example", subject="s", text="t")

    box.enqueue(both, n=1)
    drain(box)
    assert effects(box) == [("k/1", "row")]
    assert [r.state for r in box.store.outbox_find_by_key("k/1")] == ["sent"]


@pytest.mark.parametrize(
    ("write", "why"),
    [
        (lambda o: o.email(to="anna@ex\u00e4mple.com", subject="s", text="t"), "not ASCII"),
        (
            lambda o: o.email(to="a@b.example, c@d.example", subject="s", text="t"),
            "several addresses",
        ),
        (
            lambda o: o.email(to="dispatch@@broken.example", subject="s", text="t"),
            "'dispatch@@broken.example' is not an address",
        ),
        (lambda o: o.email(to="a@b.example", subject="s\x00", text="t"), "NUL"),
        (
            lambda o: o.add("email", {"subject": "no recipient", "text": "t"}),
            "at least one recipient",
        ),
        (
            lambda o: o.add(
                "email",
                {
                    "to": ["a@b.example"],
                    "subject": "s",
                    "text": "t",
                    "headers": {"X-A": "1\r\nBcc: x@y"},
                },
            ),
            "one line",
        ),
        (
            lambda o: o.email(to="a@b.example", subject="s", text="t", suffix="a~b"),
            "one key segment",
        ),
    ],
)
def test_messages_that_could_never_be_sent_are_refused_when_written(box: Box, write, why):
    box.channel("email", provider="file://unused-outbox")

    @box.task(key="bad/{n}")
    def bad(ctx, n: int) -> None:
        write(ctx.outbox)

    box.enqueue(bad, n=1)
    result = drain(box, raise_on_failure=False, dispatch=False)
    assert result.dead == 1 and why in result.failures[0].error
    assert box.store.outbox_find_by_key("bad/1") == []


def test_a_lease_given_back_unsent_does_not_start_the_idempotency_window(store_url, mail_box):
    box = mail_box(store_url, MemoryProvider(), limits=["1/day"])
    with FrozenClock(box, at=T0):
        enqueue_customers(box, [1, 2])
        result = drain(box)
        assert (result.dispatched.sent, result.dispatched.waited) == (1, 1)
        waiting = [
            r
            for c in (1, 2)
            for r in box.store.outbox_find_by_key(f"weekly-digest/customer-{c}/2026-W33")
            if r.state == "pending"
        ]
    assert [r.first_leased_at for r in waiting] == [None]
