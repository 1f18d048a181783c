"""A store outage in the middle of a dispatcher's round strands nothing: the outcomes it learned
are recorded, and the rows it had not sent given back, as soon as the store answers again — not
when the lease runs out minutes later."""

from __future__ import annotations

import pytest

from oncebox.kernel.errors import StoreUnavailable
from oncebox.lanes.dispatcher import DispatcherConfig, OutboxDispatcher
from oncebox.testing import MemoryProvider, drain
from support.faults import Outage
from support.outbox import enqueue_customers

KEYS = [f"weekly-digest/customer-{c}/2026-W33" for c in range(1, 5)]


class PlainProvider(MemoryProvider):
    """No idempotency (as SMTP): each row is marked `sending` and recorded one by one."""

    idempotent = False


def run_through_outage(box, fail: str, after: int) -> Outage:
    enqueue_customers(box, range(1, 5))
    drain(box, dispatch=False)
    store = Outage(box.store)
    dispatcher = OutboxDispatcher(
        store, box.channels, DispatcherConfig(batch_size=10), box.metrics, worker="d-test"
    )
    store.fail(fail, after=after)
    with pytest.raises(StoreUnavailable):
        dispatcher.run_once()
    store.restore()
    dispatcher.run_once()
    return store


def states(box) -> list[str]:
    return [box.store.outbox_find_by_key(key)[0].state for key in KEYS]


def test_outcomes_learned_during_an_outage_are_recorded_when_the_store_answers(store_url, mail_box):
    provider = MemoryProvider()
    box = mail_box(store_url, provider)
    store = run_through_outage(box, "outbox_finish", after=0)
    assert store.refused == ["outbox_finish"]
    assert states(box) == ["sent"] * 4
    assert len(provider.sent) == 4  # each sent once: recorded, not resent


def test_rows_not_yet_sent_when_the_store_went_away_are_given_back_and_sent(store_url, mail_box):
    provider = PlainProvider()
    box = mail_box(store_url, provider)
    store = run_through_outage(box, "outbox_mark_sending", after=2)
    assert store.refused == ["outbox_mark_sending"]
    assert states(box) == ["sent"] * 4
    assert len(provider.sent) == 4
