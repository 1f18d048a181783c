"""Held sends settled from the provider's record: a held (`ambiguous`) message with an event
saying the provider took it becomes `sent`, its receipt the provider's id, audited under the
actor `provider`. Run by the receiver as an event arrives and by the resolver lane for events
recorded before their message was held (a lost acknowledgement's webhook often arrives before
the dispatcher has written down that it does not know)."""

from __future__ import annotations

from collections.abc import Sequence

from oncebox.deliveries.events import TOOK_IT_KINDS
from oncebox.store.base import OperatorAction, Store

ACTOR = "provider"


def settle_reported(
    store: Store, channels: Sequence[str], *, only: int | None = None, batch: int = 100
) -> int:
    """Settle the held messages of `channels` (or the one row `only`) a recorded event says
    the provider took; how many were settled. Each settlement is fenced on the row still being
    held, so two settlers of one row settle it once."""
    if not channels:
        return 0
    settled = after = 0
    while True:
        page = store.outbox_reported_list(sorted(channels), TOOK_IT_KINDS, batch, after, only)
        for held in page:
            reason = f"the provider reported it {held.kind} (event {held.event_id})"
            done = store.outbox_resolve(
                OperatorAction(held.id, ACTOR, reason), "sent", held.provider_id
            )
            settled += done is not None
        if len(page) < batch:
            return settled
        after = page[-1].id
