"""`AmbiguityResolver`: settle ambiguous outbox rows by asking the provider.

For channels whose provider can look a message up (`status(outgoing, idempotency_key)`), each
ambiguous row is asked about: "sent" → `sent`, with the provider's receipt; "not_found" (it never
arrived) → resent; "unknown" → left for an operator (`box.resolve`). Each settlement is audited
under the actor `resolver`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from oncebox.lane import run_forever
from oncebox.outbox.channels import Channel
from oncebox.outbox.dispatcher import outgoing_of
from oncebox.outbox.tokens import idempotency_key
from oncebox.providers import StatusLookup
from oncebox.store.base import OperatorAction, Store

log = logging.getLogger("oncebox.resolver")


@dataclass(frozen=True)
class ResolverResult:
    sent: int = 0
    resent: int = 0
    unknown: int = 0


class AmbiguityResolver:
    def __init__(
        self,
        store: Store,
        channels: Mapping[str, Channel],
        batch_size: int = 100,
        interval: float = 60.0,
    ) -> None:
        self.store = store
        self.interval = interval
        self.channels = {
            name: channel
            for name, channel in channels.items()
            if isinstance(channel.provider, StatusLookup)
        }
        self.batch_size = batch_size

    def run_forever(self, stop: threading.Event) -> None:
        run_forever("resolver", lambda: self.run_once().sent > 0, stop, self.interval)

    @property
    def active(self) -> bool:
        return bool(self.channels)

    def run_once(self) -> ResolverResult:
        if not self.channels:
            return ResolverResult()
        sent = resent = unknown = 0
        for row in self.store.outbox_ambiguous_list(sorted(self.channels), self.batch_size):
            provider = self.channels[row.channel].provider
            assert isinstance(provider, StatusLookup)
            outgoing = outgoing_of(row, row.attempt)
            try:
                answer, receipt = provider.status(outgoing, idempotency_key(row.token))
            except Exception:
                log.exception("status lookup failed for outbox row %s", row.id)
                unknown += 1
                continue
            if answer == "unknown":
                unknown += 1
                continue
            resolution: Literal["sent", "resend"] = "sent" if answer == "sent" else "resend"
            reason = (
                "the provider's status says it was received"
                if answer == "sent"
                else "the provider's status says it never arrived"
            )
            done = self.store.outbox_resolve(
                OperatorAction(row.id, "resolver", reason),
                resolution,
                receipt.provider_id if receipt else None,
            )
            if done is not None:
                sent += answer == "sent"
                resent += answer != "sent"
        return ResolverResult(sent, resent, unknown)
