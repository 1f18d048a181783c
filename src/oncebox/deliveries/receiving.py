"""What is done with a provider's delivery event once its signature verified: read, recorded,
and answered. One place, so that the HTTP receiver (`api/deliveries.py`) and the deterministic
simulation's reporter (`sim/parts/reports.py`) take the same path, and the simulation tests the
code that runs.

Every verified event is acknowledged, so that the provider does not send it again: one recorded
(settling the held send it says the provider took, in the same transaction), a duplicate, one
about a message oncebox does not hold, and one that is not an event at all or holds text no
store keeps (counted). Only the store being away is not answered: `StoreUnavailable` escapes,
and the receiver asks the provider to retry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncebox.deliveries.events import provider_event, read_event
from oncebox.kernel.errors import InvalidArguments, InvalidInput
from oncebox.kernel.storable import checked_text
from oncebox.store.protocol import Store

log = logging.getLogger("oncebox.deliveries")


@dataclass(frozen=True)
class Received:
    """The answer to one verified event: `outcome` is the store's (`recorded`, `duplicate`,
    `unmatched`) or `unreadable` / `unstorable`, with the reason in `detail`."""

    outcome: str
    stage: str | None = None
    settled: bool = False
    detail: str | None = None

    def body(self) -> dict[str, Any]:
        """The JSON the receiver answers with."""
        body: dict[str, Any] = {
            "outcome": self.outcome,
            "stage": self.stage,
            "settled": self.settled,
        }
        if self.detail is not None:
            body["detail"] = self.detail
        return body


def receive_event(
    store: Store, channel: str, event_id: str, payload: Mapping[str, Any]
) -> Received:
    """Record one verified event of `channel`'s provider (`event_id`: the provider's id of the
    event, the same on its retries)."""
    try:
        read = read_event(payload)
        checked_text(event_id, "the event's id")
    except InvalidArguments as exc:  # signed, so the provider's: acknowledged, not retried
        return receive_unreadable(store, channel, str(exc))
    except InvalidInput as exc:  # the same: sending it again would not change it
        log.warning("channel %s: a signed delivery event no store keeps: %s", channel, exc)
        store.counter_add({"provider_events_unstorable": 1})
        return Received("unstorable", detail=str(exc))
    recorded = store.provider_event_record(provider_event(channel, event_id, read))
    return Received(recorded.outcome, read.stage, recorded.settled)


def receive_unreadable(store: Store, channel: str, reason: str) -> Received:
    """A signed request that is not a delivery event: counted and acknowledged."""
    log.warning("channel %s: a signed request that is not a delivery event: %s", channel, reason)
    store.counter_add({"provider_events_unreadable": 1})
    return Received("unreadable", detail=reason)
