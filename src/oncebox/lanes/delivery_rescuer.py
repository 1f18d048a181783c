"""`DeliveryRescuer`: outbox rows whose dispatcher lease expired.

What an expired lease means depends on how far the dispatcher got, which the row's state tells:

- `leased` on a channel **without** provider idempotency: the `sending` marker was never written,
  so no send was attempted — back to `pending`, no attempt spent;
- `leased` on a channel **with** provider idempotency: a send may have happened (there is no
  marker) — back to `pending` to be resent with the same key, unless the row was first leased
  longer ago than the provider's idempotency window: then a resend could duplicate, and the row is
  `ambiguous`;
- `sending` (no provider idempotency): the dispatcher died between marking and recording — the
  message may have been sent. Policy `hold`: `ambiguous`, visible, awaiting reconciliation;
  policy `retry`: resent, counted as a possible duplicate.

The first two spend no attempt, so each is counted on the row (`rescues`): after the channel's
`max_rescues` (5), a message that stops its dispatcher every time is dead-lettered (no send was
attempted) or held `ambiguous` (one may have been), with a reason that says what happened.
Rows of channels this process does not know are left for a worker that knows them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from oncebox.kernel.metrics import Metrics
from oncebox.lanes.lane import configured, run_forever
from oncebox.outbox import transitions
from oncebox.outbox.channels import Channel
from oncebox.outbox.transitions import OutboxFinish, past_window
from oncebox.store.protocol import Store
from oncebox.store.records import OutboxRow


@dataclass(frozen=True)
class DeliveryRescuerConfig:
    """`interval` paces `run_forever` only: in a worker the lease rescuer runs this lane's round
    inside its own (`lease_rescuer.py`), at the lease rescuer's interval."""

    interval: timedelta = timedelta(seconds=15)
    batch_size: int = 500


@dataclass(frozen=True)
class DeliveryRescuerResult:
    settled: list[OutboxFinish]

    def count(self, state: str) -> int:
        return sum(1 for finish in self.settled if finish.state == state)


def decide_expired(channel: Channel, row: OutboxRow, now: datetime) -> OutboxFinish:
    """The transition of a row whose dispatcher lease expired (see the module docstring and
    `transitions.py`)."""
    worker = row.leased_by or "a dispatcher"
    if row.state == "sending":
        if channel.ambiguity == "retry":
            return transitions.resend_possible_duplicate(
                row.id,
                f"{worker} stopped after marking the message sending; "
                "resent under policy retry (a possible duplicate)",
                outcome="lease_expired",
            )
        return transitions.hold_ambiguous(
            row.id,
            f"{worker} stopped after marking the message sending; it may "
            "have been sent (policy hold: not resent)",
        )
    rescues = row.rescues + 1
    if not channel.idempotent:
        if rescues >= channel.max_rescues:
            return transitions.dead_after_rescues(
                row.id,
                f"the dispatcher's lease ran out {rescues} times before a send was attempted "
                f"(last held by {worker}): something about this message stops its dispatcher "
                "— a crash or a hang; dead-lettered rather than retried for ever",
            )
        return transitions.unsent_after_expiry(row.id)  # no marker: nothing was sent
    if rescues >= channel.max_rescues:
        return transitions.held_after_rescues(
            row.id,
            f"the dispatcher's lease ran out {rescues} times with no outcome recorded (last "
            f"held by {worker}); each may have sent it: held, not resent again",
        )
    if past_window(channel.window, row.first_leased_at, now):
        assert row.first_leased_at is not None  # past_window is False without it
        return transitions.hold_past_window(
            row.id,
            f"{worker}'s lease expired and the row was first leased at "
            f"{row.first_leased_at.isoformat()}, past the provider's "
            f"idempotency window of {channel.window}: a resend could duplicate",
        )
    return transitions.resend_after_expiry(
        row.id, f"{worker}'s lease expired; resent with the same idempotency key"
    )


class DeliveryRescuer:
    def __init__(
        self,
        store: Store,
        channels: Mapping[str, Channel],
        metrics: Metrics,
        batch_size: int | None = None,
        *,
        config: DeliveryRescuerConfig | None = None,
    ) -> None:
        self.store = store
        self.channels = dict(channels)
        self.metrics = metrics
        self.config = configured(config, DeliveryRescuerConfig, batch_size=batch_size)
        self.batch_size = self.config.batch_size

    def run_once(self) -> DeliveryRescuerResult:
        def decide(rows: list[OutboxRow], now: datetime) -> list[OutboxFinish]:
            return [
                decide_expired(self.channels[row.channel], row, now)
                for row in rows
                if row.channel in self.channels
            ]

        settled = self.store.outbox_rescue_expired(sorted(self.channels), self.batch_size, decide)
        result = DeliveryRescuerResult(settled)
        self.metrics.count("deliveries_lease_expired", len(settled))
        self.metrics.count("deliveries_ambiguous", result.count("ambiguous"))
        return result

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            return len(self.run_once().settled) >= self.batch_size

        run_forever("delivery rescuer", once, stop, self.config.interval.total_seconds())
