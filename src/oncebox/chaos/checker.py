"""The checker: the invariants of docs/guarantees.md, read from the database, the provider's log
and the history once the run has settled.

Terms: the *eligible keys* are the digest keys of every active customer for every week the
harness fired (labelled by the harness itself, not by oncebox), plus the notice key of every
expired hold. *Accepted(t)* is how many times the provider took the message with token t (an
idempotent provider collapses replays into one). *Unknown(t)* is how many sends of t have an
outcome the system never learned: an ambiguous answer, or a send whose result the sender did not
record before it died (even if the provider had accepted it).

    S1  at most one intent per key, at every observation (also sampled during the run)
    S2  exactly one intent at the end for every eligible key that is not dead
    S3  claim, business row (the rendered digest) and outbox row are all-or-nothing per key
    S4  nothing lost: every job done, dead or cancelled; every message sent, dead or ambiguous;
        every eligible key has a job; a `sent` message really reached the provider
    S5  idempotent provider: Accepted(t) ≤ 1
    S6  no idempotency, `hold`: Accepted(t) ≤ 1, and a send with an unknown outcome is
        `ambiguous` (visible), never silently retried
    S7  no idempotency, `retry`: Accepted(t) ≤ 1 + Unknown(t), and every duplicate is reported
        (possible_duplicates ≥ Accepted(t) - 1)
    S8  dead letters are complete: each has its attempts and its last error
    S11 no stray sends: every token the provider accepted is the token of an eligible key (or
        of the poison's, which no provider takes) — nothing for an inactive customer, nothing
        invented, read from the provider's log
    L2  nothing eligible lost, seen from outside: every eligible key's message is in the
        provider's log, or the key is visibly held — its job dead, or its message dead or
        ambiguous, each with its reason. Counted from the business rows (customers, holds) and
        the provider's log, not from oncebox's intents
    P1  every period label is the ISO week of its fire instant
    B1  a broker-held queue (its jobs relayed: migration 0016): every publish the relay wrote was
        sent, and once every worker has exited the broker holds nothing for the run's queue —
        no message ready, none dead-lettered — read from the broker itself
Scenarios add their own (S9 superseded leases commit nothing, S10 replays keep the key).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from oncebox.chaos.broker import left_in_broker
from oncebox.chaos.history import SendOutcomes, read_history, send_outcomes
from oncebox.chaos.rows import Job, Message, Rows, read_rows
from oncebox.chaos.violation import Violation
from oncebox.examples.logistics.app import DIGEST_KEY, HOLD_KEY
from oncebox.outbox.tokens import derive_token

if TYPE_CHECKING:
    from oncebox.chaos.runner import RunContext


@dataclass
class Tally:
    """The figures of one run, for the report table."""

    eligible: int = 0
    delivered: int = 0
    duplicates_absorbed: int = 0
    possible_duplicates: int = 0
    actual_duplicates: int = 0
    lost: int = 0
    dead: int = 0
    ambiguous: int = 0


@dataclass
class _Facts:
    """What the checker knows once the run has settled."""

    context: RunContext
    rows: Rows
    eligible: set[str]
    poison_keys: set[str]
    jobs_by_key: dict[str, list[Job]]
    outbox_by_key: dict[str, list[Message]]
    dead_keys: set[str]
    accepted: dict[str, int]
    outcomes: SendOutcomes
    absorbed_elsewhere: int = 0  # duplicates worker processes absorbed at the claim
    found: list[Violation] = field(default_factory=list)

    def violate(self, invariant: str, key: str, evidence: str) -> None:
        self.found.append(Violation(invariant, key, evidence))


def check(context: RunContext) -> tuple[list[Violation], Tally]:
    """Every invariant, with per-key evidence; the run's figures."""
    rows = read_rows(context.box)
    poison_keys = {DIGEST_KEY.format(customer_id=context.poison, period=p) for p in context.periods}
    digest_keys = {
        DIGEST_KEY.format(customer_id=c, period=p) for c in rows.active for p in context.periods
    }
    notice_keys = {HOLD_KEY.format(hold_id=h) for h in rows.expired_holds}
    jobs_by_key: dict[str, list[Job]] = {}
    for job in rows.jobs:
        jobs_by_key.setdefault(job[1], []).append(job)
    outbox_by_key: dict[str, list[Message]] = {}
    for message in rows.outbox:
        outbox_by_key.setdefault(message[1], []).append(message)
    history = read_history(context.folder)
    facts = _Facts(
        context=context,
        rows=rows,
        eligible=(digest_keys - poison_keys) | notice_keys,
        poison_keys=poison_keys,
        jobs_by_key=jobs_by_key,
        outbox_by_key=outbox_by_key,
        dead_keys={job[1] for job in rows.jobs if job[2] == "dead"},
        accepted=context.provider.accepted(),
        outcomes=send_outcomes(history),
        absorbed_elsewhere=sum(int(e.detail) for e in history if e.op == "absorb"),
    )
    for invariant in (
        _intents,
        _all_or_nothing,
        _nothing_lost,
        _effects,
        _dead_letters,
        _periods,
        _from_outside,
        _broker,
    ):
        invariant(facts)
    tally = _tally(facts)
    tally.eligible = len(digest_keys) + len(notice_keys)
    return facts.found, tally


def _intents(f: _Facts) -> None:
    """S1 and S2."""
    intents = f.rows.intents
    for key, count in intents.items():
        if count > 1:
            f.violate("S1 one intent per key", key, f"{count} intents")
    for key in sorted(f.eligible):
        if key.startswith("weekly-digest/") and intents[key] != 1 and key not in f.dead_keys:
            f.violate("S2 one intent per eligible key", key, f"{intents[key]} intents at the end")
    for key in sorted(f.poison_keys):
        states = [job[2] for job in f.jobs_by_key.get(key, [])]
        if states != ["dead"] or intents[key]:
            f.violate(
                "S2 one intent per eligible key",
                key,
                f"the poison should be one dead job and no intent: jobs {states}, "
                f"{intents[key]} intents",
            )


def _all_or_nothing(f: _Facts) -> None:
    """S3: claim, rendered digest and outbox row together."""
    rows = f.rows
    digest_messages = {k for k in f.outbox_by_key if k.startswith("weekly-digest/")}
    for key in sorted(
        {k for k in rows.intents if k.startswith("weekly-digest/")} | digest_messages
    ):
        customer, period = _digest_parts(key)
        has_digest = (customer, period) in rows.digests
        messages = len(f.outbox_by_key.get(key, []))
        if not (rows.intents[key] >= 1 and has_digest and messages == 1):
            f.violate(
                "S3 all-or-nothing",
                key,
                f"intents {rows.intents[key]}, digest row {'yes' if has_digest else 'no'}, "
                f"outbox rows {messages}",
            )


def _nothing_lost(f: _Facts) -> None:
    """S4: nothing stuck, nothing missing, nothing claimed sent that the provider lacks."""
    for job_id, key, state, _outcome, _attempt, _error in f.rows.jobs:
        if state not in ("done", "dead", "cancelled"):
            f.violate("S4 nothing lost", key or f"job {job_id}", f"job {job_id} still {state}")
    for key in sorted(f.eligible):
        never = key not in f.jobs_by_key and not f.rows.intents[key]
        if key.startswith("weekly-digest/") and never:  # (a done job may have been pruned)
            f.violate("S4 nothing lost", key, "eligible, but no job was ever enqueued")
        if not f.outbox_by_key.get(key) and key not in f.dead_keys:
            f.violate("S4 nothing lost", key, "eligible, but no message was written")
    for message_id, key, state, token, _key, _dups, _error in f.rows.outbox:
        if state not in ("sent", "dead", "ambiguous"):
            f.violate("S4 nothing lost", key, f"message {message_id} still {state}")
        if state == "sent" and not f.accepted.get(token):
            f.violate(
                "S4 nothing lost", key, f"message {message_id} is sent; the provider has none"
            )


def _effects(f: _Facts) -> None:
    """S5-S7: what the provider took against what was reported."""
    idempotent = f.context.provider.kind == "api"
    policy = f.context.settings.ambiguity
    for message_id, key, state, token, _key, dups, _error in f.rows.outbox:
        took = f.accepted.get(token, 0)
        # a send whose outcome never reached the database is unknown to the system, even if
        # the process that made it heard "accepted" before it died
        unknown = max(
            f.outcomes.unknown.get(token, 0),
            f.outcomes.invoked.get(token, 0) - f.rows.definite_attempts[message_id],
        )
        taken = f"message {message_id} accepted {took} times"
        if idempotent and took > 1:
            f.violate("S5 one effect per key", key, taken)
        elif not idempotent and policy == "hold":
            if took > 1:
                f.violate("S6 hold: never resent", key, taken)
            if unknown and state not in ("ambiguous", "sent"):
                f.violate(
                    "S6 hold: never resent",
                    key,
                    f"message {message_id}: {unknown} unknown outcome(s), yet it is {state}",
                )
        elif not idempotent:
            if took > 1 + unknown:
                f.violate(
                    "S7 retry: duplicates only from unknowns",
                    key,
                    f"{taken}, with {unknown} unknown outcome(s)",
                )
            if dups < took - 1:
                f.violate("S7 retry: duplicates reported", key, f"{taken}, {dups} reported")


def _broker(f: _Facts) -> None:
    """B1: the relay sent every publish, and the broker holds nothing once the run is over."""
    for relay_id, key, state in f.rows.relays:
        if state != "sent":
            f.violate("B1 broker drained", key, f"publish {relay_id} is {state}, not sent")
    workload = f.context.workload
    if workload.broker is None:
        return
    left = left_in_broker(workload.broker, workload.digest_queue)
    if any(left.values()):
        f.violate(
            "B1 broker drained",
            f"queue {workload.digest_queue}",
            f"the broker still holds {left['ready']} ready message(s), {left['in_flight']} in "
            f"flight, {left['given_up']} given up on and not swept, and {left['dead']} dead "
            "letter(s) after every worker exited",
        )


def _dead_letters(f: _Facts) -> None:
    """S8: every dead letter carries its attempts and its last error."""
    for job_id, key, state, _outcome, _attempt, error in f.rows.jobs:
        if state == "dead" and (not f.rows.job_attempts[job_id] or not error):
            f.violate("S8 dead letters complete", key, f"job {job_id} dead without history")
    for message_id, key, state, _token, _key, _dups, error in f.rows.outbox:
        if state == "dead" and (not f.rows.delivery_attempts[message_id] or not error):
            f.violate("S8 dead letters complete", key, f"message {message_id} dead without history")


def _from_outside(f: _Facts) -> None:
    """S11 and L2: the provider's log against the business rows, in both directions."""
    secret = f.context.workload.secret
    known = {derive_token(secret, key): key for key in f.eligible | f.poison_keys}
    for token, count in sorted(f.accepted.items()):
        if token not in known:
            f.violate(
                "S11 no stray sends",
                f"token {token[:16]}…",
                f"the provider accepted {count} message(s) whose token is no eligible key's",
            )
    for key in sorted(f.eligible):
        if f.accepted.get(derive_token(secret, key)):
            continue
        jobs = f.jobs_by_key.get(key, [])
        messages = f.outbox_by_key.get(key, [])
        held = any(job[2] == "dead" and job[5] for job in jobs) or any(
            m[2] in ("dead", "ambiguous") and m[6] for m in messages
        )
        if not held:
            f.violate(
                "L2 nothing eligible lost (outside)",
                key,
                "not in the provider's log and not visibly held: jobs "
                f"{[(j[2], j[3]) for j in jobs]}, messages {[m[2] for m in messages]}",
            )


def _periods(f: _Facts) -> None:
    """P1: every fan-out's period is the ISO week the harness saw the schedule fire in."""
    fired = sorted(set(f.context.periods))
    for period in sorted(set(f.rows.periods) - set(fired)):
        f.violate(
            "P1 periods are ISO weeks",
            f"weekly-digest/{period}",
            f"a fan-out for {period}, but the schedule fired in {fired}",
        )


def _stale_copies(f: _Facts) -> int:
    """A broker-held queue's copies acknowledged unrun (a lost acknowledgement, a duplicate
    publish): counted by the consumer, copies of done jobs as claim conflicts beside the jobs
    that settled as duplicates."""
    if f.context.workload.broker is None:
        return 0
    counted = f.rows.counters
    settled_duplicates = sum(1 for j in f.rows.jobs if j[3] == "duplicate")
    stale_of_done = counted.get("claim_conflicts", 0) - settled_duplicates
    return max(0, stale_of_done) + counted.get("deliveries_stale", 0)


def _tally(f: _Facts) -> Tally:
    rows = f.rows
    delivered = 0
    for key in f.eligible:
        delivered += sum(
            1 for m in f.outbox_by_key.get(key, []) if m[2] == "sent" and f.accepted.get(m[3])
        )
    return Tally(
        delivered=delivered,
        duplicates_absorbed=f.context.absorbed
        + f.absorbed_elsewhere
        + sum(1 for j in rows.jobs if j[3] == "duplicate")
        + _stale_copies(f),
        possible_duplicates=sum(m[5] for m in rows.outbox),
        actual_duplicates=sum(max(0, f.accepted.get(m[3], 0) - 1) for m in rows.outbox),
        lost=sum(1 for v in f.found if v.invariant.startswith(("S2", "S4"))),
        dead=sum(1 for j in rows.jobs if j[2] == "dead")
        + sum(1 for m in rows.outbox if m[2] == "dead"),
        ambiguous=sum(1 for m in rows.outbox if m[2] == "ambiguous"),
    )


def _digest_parts(key: str) -> tuple[int, str]:
    _, customer, period = key.split("/")
    return int(customer.removeprefix("customer-")), period
