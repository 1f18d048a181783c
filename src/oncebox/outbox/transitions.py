"""The outbox state machine: every state an outbox row can be in, and every named transition.

States:

    pending    waiting for `next_attempt_at`, then for a dispatcher to lease it
    leased     held by one dispatcher (lease token + deadline); not necessarily sent
    sending    channels WITHOUT provider idempotency only: marked just before the provider call
    sent       final: the provider accepted it; its receipt is kept
    dead       final until an operator replays it: a permanent failure, or attempts spent
    ambiguous  held: it may have reached the provider and a resend could duplicate; awaits the
               resolver (a provider lookup) or an operator (`oncebox outbox resolve`)
    discarded  final: dead content no provider will take, discarded by an operator (`oncebox
               outbox discard`); its key is freed for a re-run of its job. Stored as dead with
               `discarded_at` set, read back as discarded

Transitions (the function that builds each is named in the third column; `attempt` says
whether it spends one of the channel's attempts; a test holds this table against the code):

    from              to         transition                  attempt  when
    pending           leased     (store.outbox_lease)        -        a dispatcher leases a batch
    leased            sending    (store.outbox_mark_sending) -        right before a send to a
                                                                      non-idempotent provider
    leased            pending    give_back                   no       rate limit, pause, lease
                                                                      running out
    leased|sending    sent       sent                        yes      the provider accepted it
    leased|sending    pending    retry                       yes      a retryable failure
    leased|sending    pending    throttled                   no       429 / SMTP 421: the channel
                                                                      pauses
    leased|sending    dead       dead                        yes      permanent, or attempts spent
    leased            pending    resend_same_key             yes      unknown outcome, idempotent
                                                                      provider, within its window
    leased|sending    pending    resend_possible_duplicate   yes      unknown outcome, policy retry
    leased|sending    ambiguous  hold_ambiguous              yes      unknown outcome, no safe
                                                                      resend
    leased            ambiguous  hold_past_window            no       an earlier outcome unknown,
                                                                      the window passed
    leased (expired)  pending    unsent_after_expiry         no       no marker: nothing was sent
    leased (expired)  pending    resend_after_expiry         no       idempotent: same key again
    leased (expired)  dead       dead_after_rescues          yes      no marker, and its leases
                                                                      ran out `max_rescues` times
    leased (expired)  ambiguous  held_after_rescues          yes      idempotent, and its leases
                                                                      ran out `max_rescues` times
    ambiguous         sent       (store.outbox_resolve)      -        resolver or operator: it
                                                                      arrived
    ambiguous         pending    (store.outbox_resolve)      -        resolver or operator: resend
    dead              pending    (store.outbox_replay)       -        an operator's replay, same
                                                                      key, same content
    dead              discarded  (store.outbox_discard)      -        an operator's discard: never
                                                                      sent, renamed, key freed

A lease that expires on a `sending` row ends in `hold_ambiguous` (policy hold) or
`resend_possible_duplicate` (policy retry); on an idempotent channel past its window, in
`hold_past_window`.

The dispatcher (`dispatcher.py`) takes the transitions out of `leased` and `sending`; the delivery
rescuer (`delivery_rescuer.py`) those of rows whose lease expired; operators and the resolver the
audited ones, each one SQL statement in the store. Every settlement is fenced on the row's lease
token, so a dispatcher whose lease was rescued records nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from oncebox.kernel.storable import storable_text
from oncebox.store.records import DeliveryOutcome, OutboxFinishState

ZERO = timedelta(0)


@dataclass(slots=True)  # per message: see `LeasedJob`
class OutboxFinish:
    """How one leased outbox row ends this round.

    `outcome` is the delivery-attempt record to write (None: no send was attempted, e.g. a row
    given back for a rate-limit wait); `counts_attempt` spends one of the channel's attempts;
    `possible_duplicate` counts a resend after an unknown outcome.
    """

    id: int
    state: OutboxFinishState
    outcome: DeliveryOutcome | None
    counts_attempt: bool
    delay: timedelta = timedelta(0)
    error: str | None = None
    receipt: str | None = None
    possible_duplicate: bool = False
    uncertain: bool | None = None  # set (True/False) or leave (None) the row's flag
    rescued: bool = False  # its dispatcher's lease ran out: counted on the row (`rescues`)

    def __post_init__(self) -> None:
        if self.error is not None:
            self.error = storable_text(self.error)
        if self.receipt is not None:
            self.receipt = storable_text(self.receipt)


def past_window(window: timedelta | None, first_leased_at: datetime | None, now: datetime) -> bool:
    """Whether a resend at `now` could fall outside the provider's idempotency window.

    The window is counted from the row's first lease, a conservative bound: the first send
    happened after it, so the provider remembers the key at least until `first_leased_at +
    window`. No window (a provider that never forgets) is never past; a row never leased has no
    earlier send to duplicate."""
    return window is not None and first_leased_at is not None and first_leased_at + window <= now


def give_back(row_id: int, delay: timedelta = ZERO) -> OutboxFinish:
    """Unsent, back to pending after `delay`: a wait (rate limit, pause, lease running out)."""
    return OutboxFinish(row_id, "pending", None, False, delay)


def sent(row_id: int, receipt: str | None) -> OutboxFinish:
    return OutboxFinish(row_id, "sent", "sent", True, receipt=receipt)


def retry(row_id: int, delay: timedelta, error: str) -> OutboxFinish:
    """A retryable failure: pending after the backoff, one attempt spent."""
    return OutboxFinish(row_id, "pending", "failed", True, delay, error=error)


def throttled(row_id: int, pause: timedelta, error: str) -> OutboxFinish:
    """The provider asked the whole channel to wait: pending after the pause, no attempt spent
    (the message did nothing wrong)."""
    return OutboxFinish(row_id, "pending", "throttled", False, pause, error=error)


def dead(row_id: int, error: str) -> OutboxFinish:
    return OutboxFinish(row_id, "dead", "dead", True, error=error)


def resend_same_key(row_id: int, delay: timedelta, error: str) -> OutboxFinish:
    """An unknown outcome on an idempotent channel, resent within the window under the same key
    (the provider answers a resend with its first reply). The row is marked `uncertain`, so a
    later lease past the window holds it instead of resending."""
    return OutboxFinish(row_id, "pending", "ambiguous", True, delay, error=error, uncertain=True)


def resend_possible_duplicate(
    row_id: int,
    error: str,
    delay: timedelta = ZERO,
    outcome: DeliveryOutcome = "ambiguous",
) -> OutboxFinish:
    """An unknown outcome on a channel without provider idempotency under policy `retry`:
    resent, and counted as a possible duplicate."""
    return OutboxFinish(
        row_id, "pending", outcome, True, delay, error=error, possible_duplicate=True
    )


def hold_ambiguous(row_id: int, error: str) -> OutboxFinish:
    """An unknown outcome that no resend can settle safely: held for the resolver or an
    operator. The attempt that met it is spent."""
    return OutboxFinish(row_id, "ambiguous", "ambiguous", True, error=error)


def hold_past_window(row_id: int, error: str) -> OutboxFinish:
    """An earlier outcome is unknown and the provider may have forgotten the key: held without
    a send in this round (no attempt spent)."""
    return OutboxFinish(row_id, "ambiguous", "ambiguous", False, error=error)


def unsent_after_expiry(row_id: int) -> OutboxFinish:
    """A lease expired before the `sending` marker: nothing was sent, so nothing is recorded
    but the rescue itself (counted on the row: see `dead_after_rescues`)."""
    return OutboxFinish(row_id, "pending", None, False, rescued=True)


def resend_after_expiry(row_id: int, error: str) -> OutboxFinish:
    """A lease expired on an idempotent channel, within the window: a send may have happened,
    so it is resent under the same key, marked `uncertain` (the rescue counted on the row)."""
    return OutboxFinish(
        row_id, "pending", "lease_expired", False, error=error, uncertain=True, rescued=True
    )


def dead_after_rescues(row_id: int, error: str) -> OutboxFinish:
    """A row whose dispatcher's lease ran out `max_rescues` times before any send was attempted:
    something about it stops its dispatcher (a crash, a hang). Dead, with a reason that says so,
    rather than back to pending for ever; a replay gives it a fresh count."""
    return OutboxFinish(row_id, "dead", "lease_expired", True, error=error, rescued=True)


def held_after_rescues(row_id: int, error: str) -> OutboxFinish:
    """The same on an idempotent channel, where each lost lease may have sent it: held
    `ambiguous` for the resolver or an operator, not resent again."""
    return OutboxFinish(row_id, "ambiguous", "lease_expired", True, error=error, rescued=True)
