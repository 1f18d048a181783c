"""Provider reports, on every store: an event recorded once per id, matched to its message by
token on its channel, the message's stage moved only forward, what it counted; the held messages
an event says the provider took; events pruned by age."""

from __future__ import annotations

from datetime import timedelta

from oncebox.deliveries.events import HOLDING, TOOK_IT, TOOK_IT_KINDS, below
from oncebox.outbox.transitions import OutboxFinish
from oncebox.store.params import OperatorAction, ProviderEvent, SeenHold
from oncebox.store.protocol import Store
from oncebox.store.records import ReportedHold
from support.contract import (
    T0,
    advance,
    ambiguous,
    finish_outbox,
    message,
    outbox_insert,
    write_outbox,
)

FIRST = "token-of-k/1"


def event(
    event_id: str,
    kind: str,
    stage: str | None,
    *,
    token: str | None = FIRST,
    channel: str = "email",
    provider_id: str | None = "re_1",
) -> ProviderEvent:
    return ProviderEvent(
        channel=channel,
        event_id=event_id,
        kind=kind,
        token=token,
        provider_id=provider_id,
        occurred_at=T0,
        stage=stage,
        below=below(stage) if stage else (),
        settles=stage in TOOK_IT,
        holding=HOLDING,
        reason=f"reported {kind}",
    )


def reports(store: Store) -> dict[str, int]:
    return {k: v for k, v in store.counter_list().items() if k.startswith(("reports:", "prov"))}


def test_an_event_is_recorded_once_and_moves_its_message_forward_only(store: Store):
    [outbox_id] = write_outbox(store, outbox_insert("k/1"))
    delivered = store.provider_event_record(event("msg_2", "email.delivered", "delivered"))
    assert (delivered.outcome, delivered.outbox_id, delivered.state, delivered.advanced) == (
        "recorded",
        outbox_id,
        "pending",
        True,
    )
    assert store.provider_event_record(event("msg_2", "email.delivered", "delivered")).outcome == (
        "duplicate"
    )
    # the earlier stage arrives late: recorded, the message stays delivered
    late = store.provider_event_record(event("msg_1", "email.sent", "accepted"))
    assert (late.outcome, late.advanced) == ("recorded", False)
    row = message(store, outbox_id)
    assert (row.reported, row.reported_at) == ("delivered", T0)
    advance(store, timedelta(minutes=1))
    assert store.provider_event_record(event("msg_3", "email.complained", "complained")).advanced
    assert message(store, outbox_id).reported == "complained"
    # a kind oncebox does not track is recorded for the dedupe and moves nothing
    untracked = store.provider_event_record(event("msg_4", "email.scheduled", None))
    assert (untracked.outcome, untracked.advanced) == ("recorded", False)
    assert [e.event_id for e in store.provider_event_list(outbox_id)] == [
        "msg_2",
        "msg_1",
        "msg_3",
        "msg_4",
    ]
    assert reports(store) == {
        "provider_events": 4,
        "provider_events_duplicate": 1,
        "reports:email:reported": 1,
        "reports:email:delivered": 1,
        "reports:email:complained": 1,
    }


def test_an_event_for_no_message_of_its_channel_is_unmatched(store: Store):
    write_outbox(store, outbox_insert("k/1", channel="sms"))
    assert store.provider_event_record(event("msg_1", "email.sent", "accepted")).outcome == (
        "unmatched"
    )
    foreign = event("msg_2", "email.sent", "accepted", token=None)
    assert store.provider_event_record(foreign).outcome == "unmatched"
    # the same event id on another channel is another event
    other = event("msg_1", "email.sent", "accepted", channel="sms")
    assert store.provider_event_record(other).outcome == "recorded"
    assert reports(store) == {
        "provider_events": 1,
        "provider_events_unmatched": 2,
        "reports:sms:reported": 1,
        "reports:sms:accepted": 1,
    }


def hold(store: Store, outbox_id: int) -> None:
    """Hold a written row as a send with an unknown outcome does."""
    finish = OutboxFinish(outbox_id, "ambiguous", "ambiguous", True, error="timeout")
    finish_outbox(store, outbox_id, finish)


def test_a_held_message_an_event_says_was_taken_is_settled_in_the_events_transaction(
    store: Store,
):
    outbox_id = ambiguous(store, "k/1")
    recorded = store.provider_event_record(event("msg_d", "email.delivered", "delivered"))
    assert (recorded.state, recorded.advanced, recorded.settled) == ("ambiguous", True, True)
    row = message(store, outbox_id)
    assert (row.state, row.receipt, row.reported) == ("sent", "re_1", "delivered")
    [audit] = store.audit_list(target_id=outbox_id)
    assert (audit.actor, audit.action, audit.reason) == (
        "provider",
        "resolve-sent",
        "reported email.delivered",
    )
    assert store.counter_list()["sends_settled_by_provider"] == 1
    again = store.provider_event_record(event("msg_e", "email.complained", "complained"))
    assert (again.state, again.settled) == ("sent", False)


def test_a_message_its_provider_reported_failed_stays_held_whatever_came_before(store: Store):
    first = ambiguous(store, "k/1")
    store.provider_event_record(event("msg_f", "email.failed", "failed"))
    late = store.provider_event_record(event("msg_s", "email.sent", "accepted"))
    assert (late.advanced, late.settled) == (False, False)  # sent, then failed: failed stands
    [second] = write_outbox(store, outbox_insert("k/2"))
    store.provider_event_record(event("msg_2s", "email.sent", "accepted", token="token-of-k/2"))
    store.provider_event_record(event("msg_2f", "email.failed", "failed", token="token-of-k/2"))
    hold(store, second)
    assert store.outbox_reported_list(["email"], TOOK_IT_KINDS, HOLDING, 10) == []
    assert [message(store, i).state for i in (first, second)] == ["ambiguous", "ambiguous"]
    # a bounce after the failure says the provider did send it
    store.provider_event_record(event("msg_b", "email.bounced", "bounced"))
    assert message(store, first).state == "sent"


def test_held_messages_an_event_named_before_they_were_held_are_listed_and_settled_once(
    store: Store,
):
    ids = write_outbox(store, outbox_insert("k/1"), outbox_insert("k/2"), outbox_insert("k/3"))
    store.provider_event_record(event("msg_f", "email.failed", "failed"))  # k/1: not taken
    store.provider_event_record(event("msg_a", "email.sent", "accepted", token="token-of-k/2"))
    store.provider_event_record(
        event("msg_b", "email.delivered", "delivered", token="token-of-k/2", provider_id="re_9")
    )
    store.provider_event_record(event("msg_c", "email.bounced", "bounced", token="token-of-k/3"))
    assert store.outbox_reported_list(["email"], TOOK_IT_KINDS, HOLDING, 10) == []  # none held
    for outbox_id in ids:
        hold(store, outbox_id)
    listed = store.outbox_reported_list(["email"], TOOK_IT_KINDS, HOLDING, 10)
    assert listed == [
        ReportedHold(ids[1], "email", "email.sent", "re_1", "msg_a"),
        ReportedHold(ids[2], "email", "email.bounced", "re_1", "msg_c"),
    ]
    assert store.outbox_reported_list(["email"], TOOK_IT_KINDS, HOLDING, 1) == listed[:1]
    after = store.outbox_reported_list(["email"], TOOK_IT_KINDS, HOLDING, 10, after=ids[1])
    assert after == listed[1:]
    assert store.outbox_reported_list(["sms"], TOOK_IT_KINDS, HOLDING, 10) == []
    assert store.outbox_settle_reported(listed[0]) is True
    assert store.outbox_settle_reported(listed[0]) is False  # settled once
    assert (message(store, ids[1]).state, message(store, ids[1]).receipt) == ("sent", "re_1")
    assert store.counter_list()["sends_settled_by_provider"] == 1
    assert store.outbox_reported_list(["email"], TOOK_IT_KINDS, HOLDING, 10) == listed[1:]
    assert message(store, ids[0]).state == "ambiguous"


def test_held_messages_are_listed_by_id_after_a_cursor_with_when_they_were_held(store: Store):
    first, second = write_outbox(store, outbox_insert("k/1"), outbox_insert("k/2"))
    advance(store, timedelta(minutes=3))
    hold(store, first)
    advance(store, timedelta(minutes=4))
    hold(store, second)
    write_outbox(store, outbox_insert("k/pending"))
    listed = store.outbox_ambiguous_list(["email"], 10)
    assert [(r.id, r.created_at, r.last_attempt_at) for r in listed] == [
        (first, T0, T0 + timedelta(minutes=3)),  # held when its send ended, not when written
        (second, T0, T0 + timedelta(minutes=7)),
    ]
    assert [r.id for r in store.outbox_ambiguous_list(["email"], 10, after=first)] == [second]


def test_events_are_pruned_by_age_but_kept_while_their_message_is_held(store: Store):
    [kept] = write_outbox(store, outbox_insert("k/held"))
    store.provider_event_record(event("msg_h", "email.failed", "failed", token="token-of-k/held"))
    hold(store, kept)
    write_outbox(store, outbox_insert("k/1"))
    store.provider_event_record(event("msg_1", "email.sent", "accepted"))
    advance(store, timedelta(days=2))
    store.provider_event_record(event("msg_2", "email.delivered", "delivered"))
    prunable = store.prunable("provider_events", "", timedelta(days=1), 10)
    assert (prunable.oldest, prunable.waiting) == (T0, 1)
    assert store.prune("provider_events", "", timedelta(days=1), 10) == 1
    assert store.prune("provider_events", "", timedelta(days=1), 10) == 0
    assert store.counter_list()["pruned_provider_events"] == 1
    assert [e.event_id for e in store.provider_event_list(kept)] == ["msg_h"]
    # pruned, an event's id is forgotten: a copy arriving now is recorded again
    again = store.provider_event_record(event("msg_1", "email.sent", "accepted"))
    assert (again.outcome, again.advanced) == ("recorded", False)


def test_a_resolution_with_what_the_resolver_saw_lands_only_on_that_hold_with_no_event(
    store: Store,
):
    first, second, third = (ambiguous(store, f"k/{n}") for n in (1, 2, 3))
    seen = {r.id: r for r in store.outbox_ambiguous_list(["email"], 10)}
    assert [seen[i].events for i in (first, second, third)] == [0, 0, 0]
    action = OperatorAction(first, "resolver", "judged")
    # what the resolver judged was an earlier hold (recorded by an earlier attempt)
    earlier = SeenHold(seen[first].attempt, (seen[first].last_attempt_id or 0) - 1)
    assert store.outbox_resolve(action, "resend", None, earlier) is None
    assert store.outbox_resolve(action, "resend", None, SeenHold.of(seen[first])) is not None
    # an event names the row since it was read (counted on the row, also of a kind not tracked)
    store.provider_event_record(event("msg_x", "email.scheduled", None, token="token-of-k/2"))
    assert [r.events for r in store.outbox_ambiguous_list(["email"], 10)] == [1, 0]
    action = OperatorAction(second, "resolver", "judged")
    assert store.outbox_resolve(action, "sent", "x", SeenHold.of(seen[second])) is None
    assert message(store, second).state == "ambiguous"
    # an operator's (or the provider's) resolution reads no page: the row being held suffices
    assert store.outbox_resolve(OperatorAction(second, "ops", "checked"), "sent", "x") is not None
    assert store.outbox_resolve(OperatorAction(third, "ops", "checked"), "resend", None)
