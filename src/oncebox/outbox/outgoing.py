"""What an outbox row says to its provider: shared by the dispatcher, which sends it, and the
resolver, which asks the provider about a held send under the same identity."""

from __future__ import annotations

import json

from oncebox.providers import Outgoing
from oncebox.store.records import OutboxLeased, OutboxRow


def outgoing_of(row: OutboxLeased | OutboxRow, attempt: int) -> Outgoing:
    """The message a provider is handed for an outbox row: its frozen payload and its token
    (the idempotency key and Message-ID derive from it), never the raw key."""
    return Outgoing(row.id, row.channel, row.token, json.loads(row.payload_json), attempt)
