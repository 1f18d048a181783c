"""`AmbiguityResolver`: settle held (`ambiguous`) outbox rows from the provider's own record.

Each round, for the channels whose provider reports (signed delivery webhooks, `reports=`),
can be asked (`status(outgoing, idempotency_key)`: the file sink, an API with a lookup), or
honours an idempotency key for a window (an HTTP email API):

1. held rows an event says the provider took become `sent`, with its id as the receipt
   (`deliveries/settle.py`, actor `provider`);
2. one page of the other held rows, oldest first, the next round going on from where this one
   stopped (a round is bounded; every held row is visited in turn):
   - a row held on an idempotent channel well inside the provider's window (its attempts spent
     on unknown outcomes) is sent once more under its key: the provider answers with its first
     reply if it had it, or takes it now — either way one copy, and the row is `sent` (a lookup
     by idempotency key). Not a row whose dispatchers died on it (`rescues`): that send may be
     what kills them;
   - a provider that can be asked is asked: "sent" → `sent`; "not_found" → resent, but only
     once the channel's grace (and the provider's `lookup_lag`) has passed since the row was
     held (a report may still come; a search may trail the provider's intake);
     "unknown" → left held;
   - a reporting channel with `unreported="resend"` resends a row no event named within the
     grace; with `hold` (the default) the row stays for a person (`oncebox outbox resolve`).
   A row any event names (`failed`, a kind oncebox does not track) is none of these: neither
   replayed, nor settled by a lookup, nor resent — the provider had it, and its report is the
   evidence a person judges (`oncebox outbox show`, then `resolve`).

Each write is fenced on what its round judged, in the statement itself (`outbox_resolve`): the
hold it read with its page (another worker's resolver may have resent the row since, and it may
be held anew, owed its own grace), and no event naming the row — one recorded after the check
stops the write, also when its transaction commits while the write waits for the row. A round
whose write finds the row moved on leaves it (`unknown`); the next round reads it afresh.

Every settlement is audited (actors `provider` and `resolver`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from oncebox.deliveries.events import TOOK_IT
from oncebox.deliveries.settle import settle_reported
from oncebox.kernel import points
from oncebox.lanes.lane import configured, run_forever
from oncebox.outbox.channels import Channel
from oncebox.outbox.outgoing import outgoing_of
from oncebox.outbox.tokens import idempotency_key
from oncebox.outbox.transitions import past_window
from oncebox.providers import SendError
from oncebox.providers.base import as_status_lookup, capabilities_of
from oncebox.store.params import OperatorAction, SeenHold
from oncebox.store.protocol import Store
from oncebox.store.records import OutboxRow

log = logging.getLogger("oncebox.resolver")
ZERO = timedelta(0)
ACTOR = "resolver"
# a replay must reach the provider inside its window, whatever the clocks' drift and the send's
# own time: it is made only while this much of the window is left
REPLAY_MARGIN = timedelta(minutes=10)


@dataclass(frozen=True)
class ResolverConfig:
    batch_size: int = 100  # held rows looked at per round
    interval: timedelta = timedelta(seconds=60)


@dataclass(frozen=True)
class ResolverResult:
    sent: int = 0  # a lookup found it
    resent: int = 0
    unknown: int = 0  # left held for a person
    reported: int = 0  # settled by a provider's event
    waiting: int = 0  # not found, or unreported, within the grace
    more: bool = False  # the page was full: the next round goes on from where this one stopped


class AmbiguityResolver:
    def __init__(
        self,
        store: Store,
        channels: Mapping[str, Channel],
        batch_size: int | None = None,
        interval: float | None = None,  # seconds
        *,
        config: ResolverConfig | None = None,
    ) -> None:
        self.store = store
        self.config = configured(
            config,
            ResolverConfig,
            batch_size=batch_size,
            interval=None if interval is None else timedelta(seconds=interval),
        )
        self.interval = self.config.interval.total_seconds()
        self.channels = {
            name: channel
            for name, channel in channels.items()
            if capabilities_of(channel.provider).lookup
            or channel.reports is not None
            or channel.window is not None
        }
        self.batch_size = self.config.batch_size
        self._after = 0  # the last held row the previous round looked at

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            result = self.run_once()
            return result.more or result.sent + result.reported > 0

        run_forever("resolver", once, stop, self.interval)

    @property
    def active(self) -> bool:
        return bool(self.channels)

    def run_once(self) -> ResolverResult:
        if not self.channels:
            return ResolverResult()
        counts = {"sent": 0, "resent": 0, "unknown": 0, "waiting": 0}
        reported = settle_reported(self.store, sorted(self.channels), batch=self.batch_size)
        now = self.store.clock_now()
        page = self.store.outbox_ambiguous_list(sorted(self.channels), self.batch_size, self._after)
        for row in page:
            counts[self._settle(row, now)] += 1
        more = len(page) == self.batch_size
        self._after = page[-1].id if more else 0
        return ResolverResult(reported=reported, more=more, **counts)

    def _settle(self, row: OutboxRow, now: datetime) -> str:
        """One held row: what was done with it (a key of `ResolverResult`)."""
        channel = self.channels[row.channel]
        if row.reported in TOOK_IT:  # reported after this round's settlement: the next one
            return "waiting"
        if not self._unreported(row):  # the provider had it: for a person to judge
            return "unknown"
        if self._replayable(channel, row, now):
            return self._replay(channel, row)
        lookup = as_status_lookup(channel.provider)
        lag = capabilities_of(channel.provider).lookup_lag if lookup is not None else ZERO
        grace = max(channel.reports.grace if channel.reports else ZERO, lag)
        waited = row.last_attempt_at is None or now - row.last_attempt_at >= grace
        if lookup is not None:
            try:
                answer, receipt = lookup.status(
                    outgoing_of(row, row.attempt), idempotency_key(row.token)
                )
            except Exception:
                log.exception("status lookup failed for outbox row %s", row.id)
                return "unknown"
            if answer == "sent":
                reason = "the provider's status says it was received"
                done = self._resolve(row, "sent", reason, receipt.provider_id if receipt else None)
                return "sent" if done else "unknown"
            if answer == "not_found":
                reason = "the provider's status says it never arrived"
                return self._resend(row, waited, reason)
            return "unknown"
        if channel.reports is not None and channel.reports.unreported == "resend":
            reason = f"no provider report named it within the grace of {grace}"
            return self._resend(row, waited, reason)
        return "unknown"

    def _replayable(self, channel: Channel, row: OutboxRow, now: datetime) -> bool:
        return (
            channel.window is not None
            and row.rescues == 0
            and row.first_leased_at is not None
            and not past_window(channel.window, row.first_leased_at, now + REPLAY_MARGIN)
        )

    def _replay(self, channel: Channel, row: OutboxRow) -> str:
        """The send under the row's idempotency key, inside the provider's window: its answer
        settles the row (not counted against the channel's rate limits: held rows are few)."""
        outgoing = outgoing_of(row, row.attempt)
        try:
            receipt = channel.provider.send(outgoing, idempotency_key(row.token))
        except SendError as exc:
            log.info("outbox row %s: its idempotency key answered %s", row.id, exc.reason)
            return "unknown"
        except Exception:
            log.exception("the replay of outbox row %s failed", row.id)
            return "unknown"
        reason = (
            "the provider answered its idempotency key within its window (its first reply, or "
            "the one send)"
        )
        found = receipt.provider_id or receipt.detail or None
        return "sent" if self._resolve(row, "sent", reason, found) else "unknown"

    def _resend(self, row: OutboxRow, waited: bool, reason: str) -> str:
        """Resend a held row once its grace has passed."""
        if not waited:
            return "waiting"
        return "resent" if self._resolve(row, "resend", reason, None) else "unknown"

    def _unreported(self, row: OutboxRow) -> bool:
        """Whether no provider event names the row at all (the count on the row, and the events
        themselves: one recorded by a receiver of a release before the count)."""
        return (
            row.reported is None and row.events == 0 and not self.store.provider_event_list(row.id)
        )

    def _resolve(
        self,
        row: OutboxRow,
        resolution: Literal["sent", "resend"],
        reason: str,
        receipt: str | None,
    ) -> bool:
        """Write what was judged of `row`, fenced on it (`SeenHold`); False when the row moved
        on meanwhile (resolved, held anew, or named by an event): left for the next round."""
        points.reach("resolver.judged")
        action = OperatorAction(row.id, ACTOR, reason)
        return self.store.outbox_resolve(action, resolution, receipt, SeenHold.of(row)) is not None
