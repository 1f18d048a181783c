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
        (possible_duplicates ≥ Accepted(t) − 1)
    S8  dead letters are complete: each has its attempts and its last error
    P1  every period label is the ISO week of its fire instant
Scenarios add their own (S9 superseded leases commit nothing, S10 replays keep the key).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oncebox.chaos.history import read_history, send_outcomes
from oncebox.examples.logistics.app import DIGEST_KEY, HOLD_KEY, connect

if TYPE_CHECKING:
    from oncebox.chaos.runner import RunContext


@dataclass(frozen=True)
class Violation:
    invariant: str
    key: str
    evidence: str


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
class _Rows:
    intents: Counter[str]
    jobs: list[tuple[int, str, str, str | None, int, str | None]]
    job_attempts: Counter[int]
    outbox: list[tuple[int, str, str, str, str, int, str | None]]
    delivery_attempts: Counter[int]
    definite_attempts: Counter[int]  # whose outcome the database recorded as known
    digests: set[tuple[int, str]]
    active: list[int]
    expired_holds: list[int]
    periods: list[str]


def _read(context: RunContext) -> _Rows:
    conn = connect(context.box)
    try:

        def rows(sql: str) -> list[Any]:
            return list(conn.execute(sql).fetchall())

        return _Rows(
            intents=Counter(r[0] for r in rows("SELECT key FROM oncebox_intents")),
            jobs=[
                (int(r[0]), r[1], r[2], r[3], int(r[4]), r[5])
                for r in rows(
                    "SELECT id, key, state, outcome, attempt, last_error FROM oncebox_jobs"
                )
            ],
            job_attempts=Counter(
                {
                    int(r[0]): int(r[1])
                    for r in rows(
                        "SELECT job_id, count(*) FROM oncebox_job_attempts GROUP BY job_id"
                    )
                }
            ),
            outbox=[
                (int(r[0]), r[1], r[2], r[3], r[4], int(r[5]), r[6])
                for r in rows(
                    "SELECT id, intent_key, state, token, key, possible_duplicates, last_error "
                    "FROM oncebox_outbox"
                )
            ],
            delivery_attempts=Counter(
                {
                    int(r[0]): int(r[1])
                    for r in rows(
                        "SELECT outbox_id, count(*) FROM oncebox_delivery_attempts "
                        "GROUP BY outbox_id"
                    )
                }
            ),
            definite_attempts=Counter(
                {
                    int(r[0]): int(r[1])
                    for r in rows(
                        "SELECT outbox_id, count(*) FROM oncebox_delivery_attempts "
                        "WHERE outcome IN ('sent', 'failed', 'throttled', 'dead') "
                        "GROUP BY outbox_id"
                    )
                }
            ),
            digests={
                (int(r[0]), r[1]) for r in rows("SELECT customer_id, period FROM freight_digests")
            },
            active=[int(r[0]) for r in rows("SELECT id FROM freight_customers WHERE active = 1")],
            expired_holds=[
                int(r[0]) for r in rows("SELECT id FROM freight_holds WHERE state = 'expired'")
            ],
            periods=[
                r[0]
                for r in rows(
                    "SELECT period FROM oncebox_schedule_runs WHERE schedule = 'weekly-digest'"
                )
            ],
        )
    finally:
        conn.close()


def check(context: RunContext) -> tuple[list[Violation], Tally]:
    """Every invariant, with per-key evidence; the run's figures."""
    rows = _read(context)
    found: list[Violation] = []
    tally = Tally()

    def violate(invariant: str, key: str, evidence: str) -> None:
        found.append(Violation(invariant, key, evidence))

    poison_keys = {DIGEST_KEY.format(customer_id=context.poison, period=p) for p in context.periods}
    digest_keys = {
        DIGEST_KEY.format(customer_id=c, period=p) for c in rows.active for p in context.periods
    }
    notice_keys = {HOLD_KEY.format(hold_id=h) for h in rows.expired_holds}
    eligible = (digest_keys - poison_keys) | notice_keys
    tally.eligible = len(digest_keys) + len(notice_keys)

    jobs_by_key: dict[str, list[tuple[int, str, str, str | None, int, str | None]]] = {}
    for job in rows.jobs:
        jobs_by_key.setdefault(job[1], []).append(job)
    outbox_by_key: dict[str, list[tuple[int, str, str, str, str, int, str | None]]] = {}
    for message in rows.outbox:
        outbox_by_key.setdefault(message[1], []).append(message)
    accepted = context.provider.accepted()
    outcomes = send_outcomes(read_history(context.folder))

    # S1, S2
    for key, count in rows.intents.items():
        if count > 1:
            violate("S1 one intent per key", key, f"{count} intents")
    dead_keys = {job[1] for job in rows.jobs if job[2] == "dead"}
    for key in sorted(eligible):
        if rows.intents[key] != 1 and key not in dead_keys and key.startswith("weekly-digest/"):
            violate(
                "S2 one intent per eligible key", key, f"{rows.intents[key]} intents at the end"
            )
    for key in sorted(poison_keys):
        states = [job[2] for job in jobs_by_key.get(key, [])]
        if states != ["dead"] or rows.intents[key]:
            violate(
                "S2 one intent per eligible key",
                key,
                f"the poison should be one dead job and no intent: jobs {states}, "
                f"{rows.intents[key]} intents",
            )

    # S3: claim, digest row and outbox row together
    for key in sorted(set(rows.intents) | {k for k in outbox_by_key if k.startswith("weekly-")}):
        if not key.startswith("weekly-digest/"):
            continue
        customer, period = _digest_parts(key)
        has_digest = (customer, period) in rows.digests
        messages = len(outbox_by_key.get(key, []))
        if not (rows.intents[key] >= 1 and has_digest and messages == 1):
            violate(
                "S3 all-or-nothing",
                key,
                f"intents {rows.intents[key]}, digest row {'yes' if has_digest else 'no'}, "
                f"outbox rows {messages}",
            )

    # S4: nothing lost, nothing stuck
    for job_id, key, state, _outcome, _attempt, _error in rows.jobs:
        if state not in ("done", "dead", "cancelled"):
            violate("S4 nothing lost", key or f"job {job_id}", f"job {job_id} still {state}")
    for key in sorted(eligible):
        if key.startswith("weekly-digest/") and key not in jobs_by_key and not rows.intents[key]:
            # (a done job may have been pruned since; its intent stays)
            violate("S4 nothing lost", key, "eligible, but no job was ever enqueued")
        if not outbox_by_key.get(key) and key not in dead_keys:
            violate("S4 nothing lost", key, "eligible, but no message was written")
    for message_id, key, state, token, _mkey, _dups, _error in rows.outbox:
        if state not in ("sent", "dead", "ambiguous"):
            violate("S4 nothing lost", key, f"message {message_id} still {state}")
        if state == "sent" and not accepted.get(token):
            violate("S4 nothing lost", key, f"message {message_id} is sent, the provider has none")

    # S5-S7: effects against what was reported
    idempotent = context.provider.kind == "api"
    policy = context.settings.ambiguity
    for message_id, key, state, token, _mkey, dups, _error in rows.outbox:
        took = accepted.get(token, 0)
        # a send whose outcome never reached the database is unknown to the system, even if
        # the process that made it heard "accepted" before it died
        unknown = max(
            outcomes.unknown.get(token, 0),
            outcomes.invoked.get(token, 0) - rows.definite_attempts[message_id],
        )
        tally.actual_duplicates += max(0, took - 1)
        tally.possible_duplicates += dups
        if idempotent:
            if took > 1:
                violate("S5 one effect per key", key, f"message {message_id} accepted {took}×")
        elif policy == "hold":
            if took > 1:
                violate("S6 hold: never resent", key, f"message {message_id} accepted {took}×")
            if unknown and state not in ("ambiguous", "sent"):
                violate(
                    "S6 hold: never resent",
                    key,
                    f"message {message_id}: {unknown} unknown outcome(s), yet it is {state}",
                )
        else:
            if took > 1 + unknown:
                violate(
                    "S7 retry: duplicates only from unknowns",
                    key,
                    f"message {message_id} accepted {took}× with {unknown} unknown outcome(s)",
                )
            if dups < took - 1:
                violate(
                    "S7 retry: duplicates reported",
                    key,
                    f"message {message_id} accepted {took}×, {dups} reported",
                )

    # S8: dead letters complete
    for job_id, key, state, _outcome, _attempt, error in rows.jobs:
        if state == "dead" and (not rows.job_attempts[job_id] or not error):
            violate("S8 dead letters complete", key, f"job {job_id} dead without history")
    for message_id, key, state, _token, _mkey, _dups, error in rows.outbox:
        if state == "dead" and (not rows.delivery_attempts[message_id] or not error):
            violate("S8 dead letters complete", key, f"message {message_id} dead without history")

    # P1: periods
    for period in sorted(set(rows.periods) - set(context.periods)):
        violate(
            "P1 periods are ISO weeks",
            f"weekly-digest/{period}",
            f"a fan-out for {period}, but the schedule fired in {sorted(set(context.periods))}",
        )

    tally.delivered = sum(
        1
        for key in eligible
        for m in outbox_by_key.get(key, [])
        if m[2] == "sent" and accepted.get(m[3])
    )
    tally.duplicates_absorbed = context.absorbed + sum(
        1 for job in rows.jobs if job[3] == "duplicate"
    )
    tally.lost = sum(1 for v in found if v.invariant.startswith(("S2", "S4")))
    tally.dead = sum(1 for job in rows.jobs if job[2] == "dead") + sum(
        1 for m in rows.outbox if m[2] == "dead"
    )
    tally.ambiguous = sum(1 for m in rows.outbox if m[2] == "ambiguous")
    return found, tally


def _digest_parts(key: str) -> tuple[int, str]:
    _, customer, period = key.split("/")
    return int(customer.removeprefix("customer-")), period
