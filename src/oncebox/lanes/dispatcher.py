"""`OutboxDispatcher`: the lane that delivers outbox rows to providers.

One round (`run_once`):
1. lease a batch of due rows (owner token + deadline; the statement records `first_leased_at`
   once);
2. per channel, take tokens from the shared buckets; rows beyond the grant, and every row while
   the channel is paused, go back to `pending` for when tokens return — a wait, not an attempt;
3. send each granted row:
   - a channel **without** provider idempotency (plain SMTP) first marks the row `sending` (one
     durable write), sends, and records the outcome at once;
   - a channel **with** provider idempotency sends with the row's idempotency key and records the
     batch's outcomes together (a crash before recording means a resend with the same key, which
     the provider answers with its first reply);
4. classify each outcome (providers/base.py): sent; retryable (backoff, an attempt spent, dead
   when spent out); throttled (the whole channel pauses for every dispatcher, no attempt spent);
   permanent (dead at once, the reply recorded; an alarm if the provider saw the key with
   another body); ambiguous (see channels.py for the policies).
Every settlement is fenced on the lease token: a dispatcher whose lease was rescued records
nothing. A round cut short by a store outage is finished by the next `run_once` once the store
answers: the outcomes it learned are recorded, its unsent rows given back (`_recover`).
"""

from __future__ import annotations

import logging
import random
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from oncebox.kernel import clock, points
from oncebox.kernel.metrics import Metrics
from oncebox.kernel.tracing import send_span
from oncebox.lanes.lane import run_forever
from oncebox.outbox import transitions
from oncebox.outbox.channels import Channel
from oncebox.outbox.outgoing import outgoing_of
from oncebox.outbox.ratelimit import Grant, take
from oncebox.outbox.tokens import idempotency_key
from oncebox.outbox.transitions import OutboxFinish, past_window
from oncebox.providers import (
    Receipt,
    SendAmbiguous,
    SendPermanent,
    SendRetryable,
    SendThrottled,
)
from oncebox.providers.base import BatchSender, as_batch_sender
from oncebox.store.params import OutboxLeaseParams
from oncebox.store.protocol import Store
from oncebox.store.records import OutboxLeased

log = logging.getLogger("oncebox.dispatcher")
MAX_ERROR_CHARS = 4000
ZERO = timedelta(0)
MIN_PAUSE = timedelta(seconds=1)


@dataclass(frozen=True)
class DispatcherConfig:
    batch_size: int = 100
    lease: timedelta = timedelta(minutes=5)
    poll_interval: timedelta = timedelta(seconds=5)


@dataclass
class DispatcherResult:
    leased: int = 0
    sent: int = 0
    retried: int = 0
    dead: int = 0
    ambiguous: int = 0
    throttled: int = 0
    waited: int = 0
    possible_duplicates: int = 0
    lease_lost: int = 0
    alarms: int = 0

    def add(self, other: DispatcherResult) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


class OutboxDispatcher:
    def __init__(
        self,
        store: Store,
        channels: Mapping[str, Channel],
        config: DispatcherConfig,
        metrics: Metrics,
        *,
        worker: str,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.channels = dict(channels)
        self.config = config
        self.metrics = metrics
        self.worker = worker
        self.rng = rng or random.Random()
        # How many rows the next lease asks for: the batch size, until a round has to give rows
        # back unsent (a rate limit, a lease running out); then what that round could send, and
        # doubling back from there. A throttled channel is sent at its rate by leasing about as
        # many rows as its bucket grants, not a full batch of which all but one go back.
        self._lease_size = config.batch_size
        # The round in progress: each leased row's decided outcome, None while unsent; a row
        # leaves it once its outcome is recorded. What a store outage leaves here is recorded
        # (the unsent rows given back) as soon as the store answers again — see `_recover`.
        self._open: dict[int, OutboxFinish | None] = {}
        self._open_token = ""
        for channel in self.channels.values():
            if channel.limits:
                store.rate_bucket_configure(channel.name, channel.bucket_specs())

    def next_due_in(self) -> float | None:
        """Seconds until the earliest pending message of this dispatcher's channels falls due
        (negative: due already; None: there is none), by the store's clock. A round stranded
        by a store outage is due now."""
        if self._open:
            return 0.0
        return self.store.outbox_next_due(sorted(self.channels)).seconds()

    def run_once(self) -> DispatcherResult:
        result = DispatcherResult()
        self._recover(result)
        token = str(uuid.uuid4())
        rows = self.store.outbox_lease(
            OutboxLeaseParams(
                channels=sorted(self.channels),
                limit=self._lease_size,
                worker=self.worker,
                token=token,
                lease_for=self.config.lease,
            )
        )
        result.leased = len(rows)
        if not rows:
            points.reach("dispatcher.found_nothing")
            return result
        points.reach("dispatcher.after_lease")
        started = clock.monotonic()
        self._open, self._open_token = dict.fromkeys(row.id for row in rows), token
        rows = self._quarantine(rows, token, result)
        for name in sorted({row.channel for row in rows}):
            batch = [row for row in rows if row.channel == name]
            self._channel_round(self.channels[name], batch, token, started, result)
        if result.waited:
            self._lease_size = max(1, result.leased - result.waited)
        else:
            self._lease_size = min(self.config.batch_size, self._lease_size * 2)
        self._count(result)
        return result

    def _quarantine(
        self, rows: list[OutboxLeased], token: str, result: DispatcherResult
    ) -> list[OutboxLeased]:
        """A row on which a dispatcher's lease ran out before (`rescues`) may be what stopped
        that dispatcher, or may only have shared its batch. It is sent alone — the rest of the
        batch goes back, due now, no attempt spent — so that a dispatcher that dies again is
        counted against that row only, and `max_rescues` catches a message that kills every
        dispatcher without catching the ones that were merely leased beside it."""
        suspects = [row for row in rows if row.rescues]
        if not suspects or len(rows) == 1:
            return rows
        alone = suspects[0]
        self._give_back(token, [row for row in rows if row is not alone], ZERO, result)
        return [alone]

    def _recover(self, result: DispatcherResult) -> None:
        """Settle what the last round could not: the store went away mid-round. Outcomes it
        learned are recorded now (fenced on its lease token, as ever); rows it had not sent go
        back to pending without spending an attempt — nothing was sent for them, even for a row
        whose `sending` marker may have been written. Raises `StoreUnavailable` while the store
        is still away, keeping the round for the next call."""
        if not self._open:
            return
        finishes = [
            finish if finish is not None else transitions.give_back(row_id)
            for row_id, finish in self._open.items()
        ]
        self._record(self._open_token, finishes, result)
        self._open = {}

    # -- one channel's share of a batch --------------------------------------------------------

    def _take(self, channel: Channel, want: int) -> Grant:
        names = [limit.name for limit in channel.limits]
        return self.store.rate_bucket_apply(
            channel.name, names, lambda buckets, now, paused: take(buckets, want, now, paused)
        )

    def _channel_round(
        self,
        channel: Channel,
        rows: list[OutboxLeased],
        token: str,
        started: float,
        result: DispatcherResult,
    ) -> None:
        grant = self._take(channel, len(rows))
        granted, waiting = rows[: grant.granted], rows[grant.granted :]
        if waiting:
            self._give_back(token, waiting, grant.retry_in, result)
        batch = as_batch_sender(channel.provider)
        if channel.idempotent and batch is not None and granted:
            fresh = [row for row in granted if not row.uncertain]
            if fresh:
                finishes = self._send_batch(channel, batch, fresh, started, result)
                self._open.update((finish.id, finish) for finish in finishes)
                self._record(token, finishes, result)
            granted = [row for row in granted if row.uncertain]  # one by one, as below
        pending: list[OutboxFinish] = []  # idempotent channels record the batch together
        for index, row in enumerate(granted):
            if clock.monotonic() - started > self.config.lease.total_seconds() * 0.8:
                self._give_back(token, granted[index:], timedelta(0), result)  # lease running out
                break
            finish = self._traced_send(channel, row, token, started, result)
            if finish is None:
                self._open.pop(row.id, None)  # the lease was lost: not ours to settle
                continue
            self._open[row.id] = finish
            if finish.outcome == "throttled":
                self._record(token, [*pending, finish], result)
                pending = []
                self._give_back(token, granted[index + 1 :], finish.delay, result)
                break
            if channel.idempotent:
                pending.append(finish)
            else:
                self._record(token, [finish], result)
        self._record(token, pending, result)

    def _give_back(
        self, token: str, rows: Sequence[OutboxLeased], delay: timedelta, result: DispatcherResult
    ) -> None:
        """Unsent rows back to pending, due after `delay`, without spending an attempt."""
        if not rows:
            return
        finishes = [transitions.give_back(row.id, delay) for row in rows]
        result.waited += len(self.store.outbox_finish(token, finishes))
        for finish in finishes:
            self._open.pop(finish.id, None)

    def _record(self, token: str, finishes: list[OutboxFinish], result: DispatcherResult) -> None:
        if not finishes:
            return
        settled = self.store.outbox_finish(token, finishes)
        for finish in finishes:
            self._open.pop(finish.id, None)
        lost = [f for f in finishes if f.id not in settled]
        if lost:
            result.lease_lost += len(lost)
            log.warning(
                "dispatcher %s: lease lost for outbox rows %s; outcome not recorded "
                "by this dispatcher",
                self.worker,
                [f.id for f in lost],
            )
        for finish in finishes:
            if finish.id not in settled:
                continue
            if finish.state == "sent":
                result.sent += 1
            elif finish.state == "dead":
                result.dead += 1
            elif finish.state == "ambiguous":
                result.ambiguous += 1
            elif finish.outcome == "throttled":
                result.throttled += 1
            else:
                result.retried += 1
            result.possible_duplicates += int(finish.possible_duplicate)

    # -- one send ------------------------------------------------------------------------------

    def _traced_send(
        self,
        channel: Channel,
        row: OutboxLeased,
        token: str,
        started: float,
        result: DispatcherResult,
    ) -> OutboxFinish | None:
        """`_send` in a span that continues the trace of the handler that wrote the row."""
        attempt = row.attempt + 1
        with send_span(
            row.trace_context, channel=channel.name, row=row.id, key=row.key, attempt=attempt
        ) as traced:
            finish = self._send(channel, row, token, started, result)
            if finish is None:
                traced.set(oncebox__state="lease lost")
            else:
                traced.set(oncebox__state=finish.state, oncebox__receipt=finish.receipt)
                if finish.state != "sent":
                    traced.failed(finish.error or finish.state)
            return finish

    def _send(
        self,
        channel: Channel,
        row: OutboxLeased,
        token: str,
        started: float,
        result: DispatcherResult,
    ) -> OutboxFinish | None:
        outgoing = outgoing_of(row, row.attempt + 1)
        if channel.idempotent and row.uncertain and self._past_window(channel, row, started):
            # an earlier outcome is unknown and the provider may have forgotten the key: a
            # resend now could deliver a second copy, so the row waits for reconciliation
            return transitions.hold_past_window(
                row.id,
                "an earlier attempt's outcome is unknown and the provider's idempotency "
                "window has passed since the row was first leased: not resent",
            )
        if not channel.idempotent:
            if not self.store.outbox_mark_sending(row.id, token):
                result.lease_lost += 1
                return None
            points.reach("dispatcher.after_sending_marker")
        try:
            receipt: Receipt | BaseException = channel.provider.send(
                outgoing, idempotency_key(row.token)
            )
        except Exception as exc:  # classified below
            receipt = exc
        return self._finish(channel, row, receipt, started, result)

    def _finish(
        self,
        channel: Channel,
        row: OutboxLeased,
        outcome: Receipt | BaseException,
        started: float,
        result: DispatcherResult,
    ) -> OutboxFinish:
        """What one send's outcome makes of its row: the provider's receipt, or the error it
        raised, classified."""
        if isinstance(outcome, SendThrottled):
            return self._throttled(channel, row, outcome)
        if isinstance(outcome, SendRetryable):
            return self._failed(channel, row, outcome, outcome.retry_after)
        if isinstance(outcome, SendPermanent):
            if outcome.alarm:
                result.alarms += 1
                self.metrics.count("delivery_alarms")
                log.error("ALARM outbox row %s (%s): %s", row.id, row.key, outcome.reason)
            return transitions.dead(row.id, outcome.reason[:MAX_ERROR_CHARS])
        if isinstance(outcome, SendAmbiguous):
            return self._ambiguous(channel, row, outcome.reason, started)
        if isinstance(outcome, BaseException):  # a provider bug: assume the worst about a send
            log.error(
                "provider %s failed unexpectedly on outbox row %s",
                channel.provider.name,
                row.id,
                exc_info=outcome,
            )
            return self._ambiguous(channel, row, f"{type(outcome).__name__}: {outcome}", started)
        points.reach("dispatcher.after_provider_accept_before_record")
        return transitions.sent(row.id, outcome.provider_id or outcome.detail or None)

    def _send_batch(
        self,
        channel: Channel,
        batch: BatchSender,
        rows: list[OutboxLeased],
        started: float,
        result: DispatcherResult,
    ) -> list[OutboxFinish]:
        """A batch through a provider that sends many in one exchange (`send_batch`: a relay's
        publishes, in one broker transaction) — only on an idempotent channel, where the rows'
        outcomes are recorded together anyway and none needs a `sending` marker first."""
        try:
            outcomes: Sequence[Receipt | BaseException] = batch.send_batch(
                [(outgoing_of(row, row.attempt + 1), idempotency_key(row.token)) for row in rows]
            )
        except Exception as exc:  # the whole batch's outcome is unknown
            outcomes = [exc] * len(rows)
        return [
            self._finish(channel, row, outcome, started, result)
            for row, outcome in zip(rows, outcomes, strict=True)
        ]

    def _now(self, row: OutboxLeased, started: float) -> datetime:
        """The database time now, from the lease's own timestamp and elapsed monotonic time."""
        return row.leased_at + timedelta(seconds=clock.monotonic() - started)

    def _past_window(
        self, channel: Channel, row: OutboxLeased, started: float, later: timedelta = ZERO
    ) -> bool:
        return past_window(channel.window, row.first_leased_at, self._now(row, started) + later)

    def _attempts_left(self, channel: Channel, row: OutboxLeased) -> int:
        return channel.retry.max_attempts - (row.attempt + 1 - row.attempt_base)

    def _failed(
        self,
        channel: Channel,
        row: OutboxLeased,
        exc: Exception,
        retry_after: timedelta | None,
    ) -> OutboxFinish:
        decision = channel.retry.decide(
            exc, row.attempt + 1, self._attempts_left(channel, row), self.rng
        )
        reason = str(exc)[:MAX_ERROR_CHARS]
        if not decision.retry:
            return transitions.dead(row.id, f"{reason} (final: {decision.reason})")
        delay = min(max(retry_after or ZERO, decision.delay), channel.max_pause)
        return transitions.retry(row.id, delay, reason)

    def _throttled(self, channel: Channel, row: OutboxLeased, exc: SendThrottled) -> OutboxFinish:
        wanted = exc.retry_after
        if wanted is None:
            wanted = channel.pause_on_421 if exc.smtp_421 else channel.default_throttle
        pause = max(min(wanted, channel.max_pause), MIN_PAUSE)  # "0" must not mean "hammer"
        if wanted > channel.max_pause:
            log.warning(
                "channel %s: provider asked for a %s pause; capped at %s",
                channel.name,
                wanted,
                channel.max_pause,
            )
        until = self.store.channel_pause(channel.name, pause, exc.reason[:500])
        self.metrics.count("channel_pauses")
        log.warning("channel %s paused until %s: %s", channel.name, until.isoformat(), exc.reason)
        return transitions.throttled(row.id, pause, exc.reason[:MAX_ERROR_CHARS])

    def _ambiguous(
        self, channel: Channel, row: OutboxLeased, reason: str, started: float
    ) -> OutboxFinish:
        reason = reason[:MAX_ERROR_CHARS]
        left = self._attempts_left(channel, row)
        if channel.idempotent:
            delay = channel.retry.backoff(row.attempt + 1, self.rng)
            # the resend must happen within the window, not merely be decided within it
            if self._past_window(channel, row, started, later=delay) or left <= 0:
                why = "past the provider's idempotency window" if left > 0 else "attempts spent"
                return transitions.hold_ambiguous(
                    row.id, f"{reason} ({why}: a resend could duplicate)"
                )
            # resend with the same key: the provider deduplicates within its window
            return transitions.resend_same_key(row.id, delay, reason)
        if channel.ambiguity == "retry" and left > 0:
            delay = channel.retry.backoff(row.attempt + 1, self.rng)
            return transitions.resend_possible_duplicate(row.id, reason, delay)
        return transitions.hold_ambiguous(row.id, f"{reason} (held for reconciliation: no resend)")

    def _count(self, result: DispatcherResult) -> None:
        for name in (
            "sent",
            "retried",
            "dead",
            "ambiguous",
            "throttled",
            "waited",
            "possible_duplicates",
            "lease_lost",
        ):
            self.metrics.count(f"deliveries_{name}", getattr(result, name))

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            return self.run_once().leased >= self.config.batch_size

        run_forever("dispatcher", once, stop, self.config.poll_interval.total_seconds())
