"""A message whose dispatcher dies every time it holds it does not go back to `pending` for
ever: each lease that runs out with no outcome recorded is counted on the row, and after the
channel's `max_rescues` the row is dead (no send was attempted) or held `ambiguous` (one may
have been), with a reason that says what happened."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oncebox.kernel import points
from oncebox.lanes.delivery_rescuer import DeliveryRescuer
from oncebox.testing import FrozenClock, MemoryProvider, drain
from support.outbox import enqueue_customers

T0 = datetime(2026, 8, 17, 9, tzinfo=UTC)
KEY = "weekly-digest/customer-1/2026-W33"


class PlainProvider(MemoryProvider):
    idempotent = False


def die_holding_it(box) -> None:
    """A dispatcher leases the row and stops before anything else (killed, or hung)."""
    with (
        points.installed({"dispatcher.after_lease": points.raising(SystemExit(9))}),
        pytest.raises(SystemExit),
    ):
        box.dispatcher().run_once()


@pytest.mark.parametrize(
    ("provider", "final", "outcome"),
    [(PlainProvider, "dead", "before a send was attempted"), (MemoryProvider, "ambiguous", "")],
    ids=["no-idempotency", "idempotent"],
)
def test_a_message_whose_dispatcher_dies_every_time_stops_after_max_rescues(
    store_url, mail_box, provider, final, outcome
):
    memory = provider()
    box = mail_box(store_url, memory, max_rescues=3)
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, [1])
        drain(box, dispatch=False)
        rescuer = DeliveryRescuer(box.store, box.channels, box.metrics)
        seen = []
        for _ in range(3):
            die_holding_it(box)
            clock.advance(timedelta(hours=1))  # past the dead dispatcher's lease
            rescuer.run_once()
            [row] = box.store.outbox_find_by_key(KEY)
            seen.append((row.state, row.rescues))
        assert seen == [("pending", 1), ("pending", 2), (final, 3)]
        [row] = box.store.outbox_find_by_key(KEY)
        assert "ran out 3 times" in (row.last_error or "") and outcome in (row.last_error or "")
        assert memory.deliveries == []  # it never reached the provider
        if final == "dead":  # a replay gives it a fresh count, and it is delivered
            box.replay(KEY, reason="the dispatcher bug is fixed", kind="delivery")
            [row] = box.store.outbox_find_by_key(KEY)
            assert (row.state, row.rescues) == ("pending", 0)
            assert drain(box).dispatched.sent == 1
    box.close()


def test_max_rescues_is_a_bounded_channel_policy(store_url, mail_box):
    from oncebox import ConfigurationError

    with pytest.raises(ConfigurationError, match="max_rescues"):
        mail_box(store_url, MemoryProvider(), max_rescues=0)


class KillingProvider(MemoryProvider):
    """Idempotent; sending one message stops the dispatcher every time (a crash in the
    provider's library on that payload)."""

    def __init__(self, poison_subject: str) -> None:
        super().__init__()
        self.poison_subject = poison_subject

    def send(self, outgoing, idempotency_key):
        if outgoing.payload.get("subject") == self.poison_subject:
            raise SystemExit(9)
        return super().send(outgoing, idempotency_key)


def test_only_the_message_that_stops_its_dispatcher_is_held_not_those_leased_beside_it(
    store_url,
):
    """The culprit shares its first batch with two others: after the first rescue each is
    sent alone, so the two are delivered and only the culprit reaches `max_rescues`."""
    from oncebox import Box, Retry

    box = Box(store_url, secret="outbox-test-secret-0123456789")
    provider = KillingProvider("poison")
    box.channel("email", provider=provider, max_rescues=3)

    @box.task(key="note/{n}", retry=Retry(max_attempts=1))
    def note(ctx, n: int) -> None:
        ctx.outbox.email(to=f"n{n}@example.com", subject="poison" if n == 2 else f"n{n}", text="x")

    with FrozenClock(box, at=T0) as clock:
        for n in (1, 2, 3):
            box.enqueue(note, n=n)
        drain(box, dispatch=False)
        rescuer = DeliveryRescuer(box.store, box.channels, box.metrics)
        for _ in range(10):
            try:
                box.dispatcher().run_once()
            except SystemExit:
                clock.advance(timedelta(hours=1))  # the dead dispatcher's lease runs out
                rescuer.run_once()
        states = {n: box.store.outbox_find_by_key(f"note/{n}")[0].state for n in (1, 2, 3)}
    assert states == {1: "sent", 2: "ambiguous", 3: "sent"}
    assert sorted(m["subject"] for m in provider.messages()) == ["n1", "n3"]
    box.close()
