"""Held sends settled from the provider's record, for events recorded before their message was
held (a lost acknowledgement's webhook often arrives before the dispatcher has written down that
it does not know): a held (`ambiguous`) message with an event saying the provider took it
becomes `sent`, its receipt the provider's id, audited under the actor `provider` and counted.
An event that finds its message already held settles it in its own transaction
(`Store.provider_event_record`)."""

from __future__ import annotations

from collections.abc import Sequence

from oncebox.deliveries.events import HOLDING, TOOK_IT_KINDS
from oncebox.store.protocol import Store


def settle_reported(store: Store, channels: Sequence[str], *, batch: int = 100) -> int:
    """Settle the held messages of `channels` a recorded event says the provider took (not
    those it last reported failed); how many were settled. Each settlement is fenced on the
    row still being held, so two settlers of one row settle it once."""
    if not channels:
        return 0
    settled = after = 0
    while True:
        page = store.outbox_reported_list(sorted(channels), TOOK_IT_KINDS, HOLDING, batch, after)
        settled += sum(store.outbox_settle_reported(held) for held in page)
        if len(page) < batch:
            return settled
        after = page[-1].id
