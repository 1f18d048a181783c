"""What the checker reads once a run has settled, and what the real-clock settle loop watches:
the oncebox rows (jobs, intents, messages, attempts) and the freight app's business rows
(customers, holds, rendered digests), read with plain SQL."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from oncebox import Box
from oncebox.examples.logistics.app import DIGEST_KEY, connect

Job = tuple[int, str, str, str | None, int, str | None]  # id, key, state, outcome, attempt, error
Message = tuple[int, str, str, str, str, int, str | None]  # id, intent key, state, token, key, …
Relay = tuple[int, str, str]  # id, key, state


@dataclass
class Rows:
    intents: Counter[str]
    jobs: list[Job]
    job_attempts: Counter[int]
    outbox: list[Message]  # the business's messages (the relay's publishes are `relays`)
    delivery_attempts: Counter[int]
    definite_attempts: Counter[int]  # whose outcome the database recorded as known
    digests: set[tuple[int, str]]
    active: list[int]
    expired_holds: list[int]
    periods: list[str]
    relays: list[Relay]  # a broker-held queue's publishes (0016): transport, not sends
    counters: dict[str, int]  # the durable counters (oncebox.kernel.counters)


def read_rows(box: Box) -> Rows:
    conn = connect(box)
    try:

        def rows(sql: str) -> list[Any]:
            return list(conn.execute(sql).fetchall())

        return Rows(
            intents=Counter(r[0] for r in rows("SELECT key FROM oncebox_intents")),
            jobs=[
                (int(r[0]), r[1], r[2], r[3], int(r[4]), r[5])
                for r in rows(
                    "SELECT id, key, state, outcome, attempt, last_error FROM oncebox_all_jobs"
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
                    "FROM oncebox_outbox WHERE channel NOT LIKE '~%'"
                )
            ],
            relays=[
                (int(r[0]), r[1], r[2])
                for r in rows("SELECT id, key, state FROM oncebox_outbox WHERE channel LIKE '~%'")
            ],
            counters={
                r[0]: int(r[1])
                for r in rows("SELECT name, sum(value) FROM oncebox_counters GROUP BY name")
            },
            **_attempt_counts(
                rows(
                    "SELECT outbox_id, count(*), sum(CASE WHEN outcome IN ('sent', 'failed', "
                    "'throttled', 'dead') THEN 1 ELSE 0 END) FROM oncebox_delivery_attempts "
                    "GROUP BY outbox_id"
                )
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


def _attempt_counts(rows: list[Any]) -> dict[str, Counter[int]]:
    """Delivery attempts per message: all of them, and those with a known outcome."""
    return {
        "delivery_attempts": Counter({int(r[0]): int(r[1]) for r in rows}),
        "definite_attempts": Counter({int(r[0]): int(r[2]) for r in rows}),
    }


def unsettled(rows: Rows, periods: list[str], poison: int) -> list[str]:
    """What is not yet in a visible state: jobs not done, dead or cancelled; messages not
    sent, dead or ambiguous; eligible digests of the run's periods with neither a job nor a
    message yet (a fan-out still to finish)."""
    left = [f"job {j[0]} {j[1]} {j[2]}" for j in rows.jobs if j[2] not in _FINAL_JOB]
    left += [f"message {m[0]} {m[1]} {m[2]}" for m in rows.outbox if m[2] not in _FINAL_MESSAGE]
    left += [f"publish {r[0]} {r[1]} {r[2]}" for r in rows.relays if r[2] not in _FINAL_MESSAGE]
    keyed = {j[1] for j in rows.jobs} | {m[1] for m in rows.outbox}
    for period in sorted(set(periods)):
        for customer in rows.active:
            key = DIGEST_KEY.format(customer_id=customer, period=period)
            if customer != poison and key not in keyed and not rows.intents[key]:
                left.append(f"{key}: no job yet")
    return left


_FINAL_JOB = ("done", "dead", "cancelled")
_FINAL_MESSAGE = ("sent", "dead", "ambiguous")
