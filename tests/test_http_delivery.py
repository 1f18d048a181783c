"""Delivery through an HTTP email API with idempotency keys (a real server on loopback that
behaves like Resend): retries, throttling, lost responses — and never a duplicate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oncebox.fakes.email_api import FakeEmailApi
from oncebox.outbox.tokens import derive_token, idempotency_key
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
def api():
    with FakeEmailApi() as server:
        yield server


def test_accepted_messages_record_the_providers_receipt(api, store_url, mail_box):
    box = mail_box(store_url, api.url)
    enqueue_customers(box, [1, 2])
    assert drain(box).dispatched.sent == 2
    sent = {d.token: d for d in api.delivered}
    assert set(sent) == {token(1), token(2)}
    assert sent[token(1)].idempotency_key == idempotency_key(token(1))
    assert key(1) not in str(sent[token(1)].body)
    assert row(box, 1).receipt == sent[token(1)].message_id


@pytest.mark.parametrize("failure", ["500", "503", "408", "409-in-progress"])
def test_retryable_answers_are_retried_and_deliver_once(api, store_url, failure, mail_box):
    box = mail_box(store_url, api.url)
    api.script(failure)
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        assert drain(box).dispatched.retried == 1
        assert row(box, 1).attempt == 1
        clock.set(row(box, 1).next_attempt_at)
        assert drain(box).dispatched.sent == 1
    assert api.tokens() == [token(1)]


@pytest.mark.parametrize("retry_after", ["429:30", "429:date:30"])
def test_a_429_pauses_the_whole_channel_until_retry_after(api, store_url, retry_after, mail_box):
    box = mail_box(store_url, api.url)
    api.script(retry_after)
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1, 2, 3])
        first = drain(box)
        assert (first.dispatched.throttled, first.dispatched.waited) == (1, 2)
        assert [row(box, c).attempt for c in (1, 2, 3)] == [0, 0, 0]  # waits spend nothing
        requests = api.requests
        clock.advance(timedelta(seconds=29))
        assert drain(box).dispatched.sent == 0
        assert api.requests == requests  # nobody called the provider while paused
        clock.advance(timedelta(seconds=1))
        assert drain(box).dispatched.sent == 3
    assert sorted(api.tokens()) == sorted(token(c) for c in (1, 2, 3))


def test_an_absurd_retry_after_is_capped(api, store_url, mail_box):
    box = mail_box(store_url, api.url, max_pause=timedelta(minutes=10))
    api.script("429:999999999")
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        drain(box)
        clock.advance(timedelta(minutes=10))
        assert drain(box).dispatched.sent == 1


@pytest.mark.parametrize("loss", ["accept-then-timeout:3", "accept-then-reset"])
def test_a_lost_response_is_resent_with_the_same_key_and_not_duplicated(
    api, store_url, loss, mail_box
):
    url = f"{api.url}?timeout=0.5"
    box = mail_box(store_url, url)
    api.script(loss)
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        first = drain(box)
        assert first.dispatched.retried == 1  # unknown outcome: resent, same key
        assert row(box, 1).state == "pending"
        clock.set(row(box, 1).next_attempt_at)
        assert drain(box).dispatched.sent == 1
    assert api.tokens() == [token(1)]  # the provider replayed its first answer
    outcomes = [a.outcome for a in box.store.delivery_attempt_list(row(box, 1).id)]
    assert outcomes == ["ambiguous", "sent"]


@pytest.mark.parametrize(
    ("failure", "alarm"), [("422", False), ("400", False), ("409-mismatch", True)]
)
def test_permanent_answers_are_dead_at_once(api, store_url, failure, alarm, mail_box):
    box = mail_box(store_url, api.url)
    api.script(failure)
    enqueue_customers(box, [1])
    result = drain(box, raise_on_failure=False)
    dead = row(box, 1)
    assert (result.dispatched.dead, dead.state, dead.attempt) == (1, "dead", 1)
    assert f"HTTP {failure[:3]}" in dead.last_error
    assert result.dispatched.alarms == int(alarm)
    box.replay(dead.id, kind="delivery", reason="fixed")
    assert drain(box).dispatched.sent == 1
    assert api.tokens() == [token(1)]


def test_an_unknown_outcome_past_the_idempotency_window_is_held(api, store_url, mail_box):
    box = mail_box(store_url, f"{api.url}?timeout=0.5&window_hours=1")
    api.script("accept-then-reset", "reset")  # the resend's outcome is unknown too
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        drain(box)
        clock.advance(timedelta(hours=1))  # a resend now could fall outside the provider's memory
        result = drain(box, raise_on_failure=False)
    assert result.dispatched.ambiguous == 1
    held = row(box, 1)
    assert held.state == "ambiguous" and "idempotency window" in held.last_error
    assert api.tokens() == [token(1)]


def test_an_ambiguous_row_resolved_resend_past_the_window_is_sent_once(api, store_url, mail_box):
    """The operator decided it was not delivered: the next send is a first one, not another
    "uncertain past the window" that holds it ambiguous again (found by the state machine)."""
    box = mail_box(store_url, f"{api.url}?timeout=0.5&window_hours=1")
    api.script("reset")  # nothing delivered, and the client cannot tell
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        drain(box, raise_on_failure=False)
        clock.advance(timedelta(hours=2))
        drain(box, raise_on_failure=False)
        held = row(box, 1)
        assert held.state == "ambiguous" and api.tokens() == []
        box.resolve(held.id, "resend", reason="the provider's log has no such message")
        drain(box)
    assert row(box, 1).state == "sent"
    assert api.tokens() == [token(1)]


def test_a_dispatcher_that_died_holding_a_lease_past_the_window_leaves_it_ambiguous(
    api, store_url, mail_box
):
    from oncebox.lanes.delivery_rescuer import DeliveryRescuer
    from oncebox.store.params import OutboxLeaseParams

    box = mail_box(store_url, f"{api.url}?window_hours=1")
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1, 2])
        drain(box, dispatch=False)
        leased = box.store.outbox_lease(
            OutboxLeaseParams(
                ["email"], 1, "died", "00000000-0000-0000-0000-000000000001", timedelta(minutes=5)
            )
        )
        assert len(leased) == 1
        clock.advance(timedelta(minutes=6))
        rescued = DeliveryRescuer(box.store, box.channels, box.metrics).run_once()
        assert [(f.state, f.outcome) for f in rescued.settled] == [("pending", "lease_expired")]
        box.store.outbox_lease(
            OutboxLeaseParams(
                ["email"],
                1,
                "died-again",
                "00000000-0000-0000-0000-000000000002",
                timedelta(minutes=5),
            )
        )
        clock.advance(timedelta(hours=1))
        rescued = DeliveryRescuer(box.store, box.channels, box.metrics).run_once()
    assert [f.state for f in rescued.settled] == ["ambiguous"]
    [held] = rescued.settled
    assert "past the provider's idempotency window" in box.store.outbox_get(held.id).last_error


def test_a_retry_after_on_a_5xx_is_capped_like_any_pause(api, store_url, mail_box):
    box = mail_box(store_url, api.url, max_pause=timedelta(minutes=10))
    api.script("503:999999999")
    with FrozenClock(box, at=T0):
        enqueue_customers(box, [1])
        drain(box)
    assert row(box, 1).next_attempt_at <= T0 + timedelta(minutes=10)


def test_rejected_credentials_pause_the_channel_instead_of_killing_messages(
    api, store_url, mail_box
):
    box = mail_box(store_url, api.url)
    api.script("401")
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1, 2])
        first = drain(box, raise_on_failure=False)
        assert (first.dispatched.throttled, first.dispatched.dead) == (1, 0)
        assert [row(box, c).attempt for c in (1, 2)] == [0, 0]
        clock.advance(timedelta(minutes=2))
        assert drain(box).dispatched.sent == 2


def test_a_resend_held_up_past_the_window_is_held_not_sent(store_url, mail_box):
    """The decision to resend is taken inside the window; a 1/day bucket then delays the resend
    past it. The resend must not go out: the provider has forgotten the key by then."""
    from oncebox.providers import Receipt, SendAmbiguous

    class Windowed:
        name, idempotent, idempotency_window = "windowed", True, timedelta(hours=24)

        def __init__(self) -> None:
            self.first_seen: dict[str, datetime] = {}
            self.deliveries = 0

        def send(self, outgoing, key):
            now = box.store.clock_now()
            first = self.first_seen.get(key)
            if first is not None and now - first < self.idempotency_window:
                return Receipt("replayed")
            self.first_seen[key] = now
            self.deliveries += 1
            if self.deliveries == 1:
                raise SendAmbiguous("the answer was lost")
            return Receipt("ok")

    provider = Windowed()
    box = mail_box(store_url, provider, limits=["1/day"])
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        drain(box, raise_on_failure=False)
        for _ in range(5):
            if row(box, 1).state != "pending":
                break
            clock.set(max(row(box, 1).next_attempt_at, clock.instant + timedelta(hours=12)))
            drain(box, raise_on_failure=False)
    assert row(box, 1).state == "ambiguous"
    assert provider.deliveries == 1


@pytest.mark.parametrize(
    ("header", "pause"),
    [
        ("0", timedelta(seconds=1)),  # "0" must not mean "hammer the provider"
        ("-5", timedelta(seconds=1)),
        ("1.5", timedelta(seconds=1.5)),
        ("garbage", timedelta(seconds=60)),  # default_throttle
        ("date:-3600", timedelta(seconds=1)),
        ("date:315360000", timedelta(hours=1)),  # capped at max_pause
    ],
)
def test_a_429s_retry_after_becomes_a_bounded_pause_that_spends_no_attempt(
    api, sqlite_url, mail_box, header, pause
):
    box = mail_box(sqlite_url, api.url)
    api.script(f"429:{header}")
    with FrozenClock(box, at=T0):
        enqueue_customers(box, [1])
        result = drain(box, raise_on_failure=False)
    [row] = box.store.outbox_find_by_key("weekly-digest/customer-1/2026-W33")
    assert (result.dispatched.throttled, result.dispatched.dead) == (1, 0)
    assert (row.state, row.attempt) == ("pending", 0)
    assert row.next_attempt_at - T0 == pause
