"""What must hold, written once as docs/guarantees.md states it, read after every step and once
the world is quiet.

The checker reads the database with its own SQL, between steps (every actor parked), as an
observer independent of the store's statements; and the providers' records, the outside world's
side. After every step:

    S1  at most one intent per key
    D1  a message never reaches the outside more often than its policy allows: once, plus once
        for each time a person chose to send it again (a held send resolved `resend`, a dead
        one replayed) — an idempotent channel's resend inside its window collapses at the
        provider and is no copy; a held send is never resent without a person
    D2  a `sent` message reached its provider, unless a person said it arrived
    D3  a message keeps its token for life — the HMAC of its key, a replay or a discard
        notwithstanding — and every copy the outside received carries a message's token, under
        the idempotency key made from it (a replay under a new key is a new message to the
        provider, which no window collapses)
    F1  a leased job or message is leased by one lease: its token and its deadline set together
    S3  a handler's effect commits once per key, with its claim: one `sim_effects` row per
        intent, none without one
    F2  a writer fenced out commits nothing: no effect committed by an attempt whose lease was
        rescued (recorded `lease_expired`)
    C1  the durable counters equal a recount from the rows: every job enqueued counted once, every
        job done counted once as completed or as a duplicate (a writer fenced out counts nothing)

Once faults stop, after every step of the quiet phase:

    A1  a handler runs at most twice under one attempt: in its batch, then on its own when
        another job's writes were refused — a job whose own writes the database refuses spends
        its attempt, and is not given back to run again for ever

Once faults stop and the lanes have run until nothing is due (`quiet`):

    L1  every key an enqueue asked for has a job, and every job and message is at an end —
        done, dead or cancelled; sent, dead, held (`ambiguous`) or discarded — each visible
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from oncebox.outbox.tokens import derive_token, idempotency_key
from oncebox.sim.providers import SimProvider

JOB_ENDS = frozenset({"done", "dead", "cancelled"})
MESSAGE_ENDS = frozenset({"sent", "dead", "ambiguous", "discarded"})
RESENT_BY_A_PERSON = ("resolve-resend", "replay")


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


class Checker:
    """See the module docstring. `connection` is the checker's own, outside every actor."""

    def __init__(
        self,
        connection: Any,
        providers: dict[str, SimProvider],
        secret: str,
        runs: Counter[tuple[int, int]],
    ) -> None:
        self.connection = connection
        self.providers = providers
        self.secret = secret  # the box's: the checker derives each key's token itself
        self.runs = runs  # the handler's runs by (job, attempt), counted by the handler
        self.quieted = False

    def faults_stop(self) -> None:
        """The quiet phase begins: from here a handler's runs are counted against A1 (a lost
        connection gives a batch back unspent, so before it they are not bounded)."""
        self.runs.clear()
        self.quieted = True

    def _rows(self, sql: str) -> list[Any]:
        cursor = self.connection.execute(sql)
        rows = list(cursor.fetchall())
        commit = getattr(self.connection, "commit", None)
        if callable(commit) and not getattr(self.connection, "autocommit", True):
            commit()
        return rows

    def after_step(self) -> list[Violation]:
        found: list[Violation] = []
        for key, count in self._rows(
            "SELECT key, count(*) FROM oncebox_intents GROUP BY key HAVING count(*) > 1"
        ):
            found.append(Violation("S1", f"{count} intents for {key}"))
        found += self._copies()
        found += self._tokens()
        for kind, table in (("job", "oncebox_jobs"), ("message", "oncebox_outbox")):
            for row_id, state in self._rows(
                f"SELECT id, state FROM {table} WHERE (lease_token IS NULL) <> "
                "(lease_expires_at IS NULL)"
            ):
                found.append(Violation("F1", f"{kind} {row_id} ({state}): a half-written lease"))
        found += self._counted()
        found += self._effects()
        if self.quieted:
            found += [
                Violation("A1", f"job {job} ran its handler {count} times under attempt {attempt}")
                for (job, attempt), count in sorted(self.runs.items())
                if count > 2
            ]
        return found

    def _effects(self) -> list[Violation]:
        found = []
        effects = Counter(key for (key,) in self._rows("SELECT key FROM sim_effects"))
        intents = {key for (key,) in self._rows("SELECT key FROM oncebox_intents")}
        for key, count in effects.items():
            if count > 1:
                found.append(
                    Violation("S3", f"{key}: its handler's effect committed {count} times")
                )
            if key not in intents:
                found.append(Violation("S3", f"{key}: an effect committed without its intent"))
        for job_id, attempt in self._rows(
            "SELECT e.job_id, e.attempt FROM sim_effects e JOIN oncebox_job_attempts a "
            "ON a.job_id = e.job_id AND a.attempt = e.attempt AND a.outcome = 'lease_expired'"
        ):
            found.append(
                Violation(
                    "F2", f"job {job_id} attempt {attempt} committed after its lease was rescued"
                )
            )
        return found

    def _counted(self) -> list[Violation]:
        counters = dict(self._rows("SELECT name, sum(value) FROM oncebox_counters GROUP BY name"))
        [(jobs, completed, duplicates)] = self._rows(
            "SELECT count(*), "
            "coalesce(sum(CASE WHEN state = 'done' AND outcome = 'completed' THEN 1 END), 0), "
            "coalesce(sum(CASE WHEN state = 'done' AND outcome = 'duplicate' THEN 1 END), 0) "
            "FROM oncebox_jobs"
        )
        found = []
        for name, rows in (
            ("jobs_enqueued", jobs),
            ("jobs_completed", completed),
            ("claim_conflicts", duplicates),
        ):
            if int(counters.get(name) or 0) != int(rows):
                found.append(
                    Violation("C1", f"{name} counts {counters.get(name) or 0}, the rows {rows}")
                )
        return found

    def _copies(self) -> list[Violation]:
        rows = self._rows("SELECT id, channel, token, state FROM oncebox_outbox")
        resent = Counter(
            int(target)
            for target, action in self._rows(
                "SELECT target_id, action FROM oncebox_audit WHERE target_kind = 'delivery'"
            )
            if action in RESENT_BY_A_PERSON
        )
        said_sent = {
            int(target)
            for (target,) in self._rows(
                "SELECT target_id FROM oncebox_audit WHERE action = 'resolve-sent'"
            )
        }
        found: list[Violation] = []
        copies = {name: provider.copies() for name, provider in self.providers.items()}
        for row_id, channel, token, state in rows:
            got = copies.get(channel, {}).get(token, 0)
            allowed = 1 + resent[int(row_id)]
            if got > allowed:
                found.append(
                    Violation(
                        "D1",
                        f"message {row_id} ({channel}, {state}) reached the outside {got} "
                        f"times; its policy allows {allowed}",
                    )
                )
            if state == "sent" and got == 0 and int(row_id) not in said_sent:
                found.append(
                    Violation("D2", f"message {row_id} ({channel}) is sent but never arrived")
                )
        return found

    def _tokens(self) -> list[Violation]:
        found: list[Violation] = []
        tokens = set()
        for row_id, key, token in self._rows("SELECT id, key, token FROM oncebox_outbox"):
            tokens.add(token)
            original = str(key).removesuffix(f"~discarded-{row_id}")
            if token != derive_token(self.secret, original):
                found.append(
                    Violation("D3", f"message {row_id} ({original}) no longer has its key's token")
                )
        for name, provider in self.providers.items():
            for delivered in provider.deliveries:
                if delivered.token not in tokens:
                    found.append(
                        Violation("D3", f"{name} received a copy under a token no message has")
                    )
                elif delivered.key != idempotency_key(delivered.token):
                    found.append(
                        Violation("D3", f"{name} received a copy under another message's key")
                    )
        return found

    def quiet(self, wanted: set[str]) -> list[Violation]:
        found: list[Violation] = []
        jobs = self._rows("SELECT id, key, state FROM oncebox_jobs")
        keys = {key for _, key, _ in jobs}
        for key in sorted(wanted - keys):
            found.append(Violation("L1", f"{key} was enqueued and has no job"))
        for job_id, key, state in jobs:
            if state not in JOB_ENDS:
                found.append(Violation("L1", f"job {job_id} ({key}) is still {state}"))
        for row_id, channel, state, discarded in self._rows(
            "SELECT id, channel, state, discarded_at FROM oncebox_outbox"
        ):
            shown = "discarded" if discarded is not None else state
            if shown not in MESSAGE_ENDS:
                found.append(Violation("L1", f"message {row_id} ({channel}) is still {shown}"))
        return found

    def unfinished(self) -> int:
        """Jobs and messages not yet at an end (the drain goes on while there are any)."""
        [(jobs,)] = self._rows(
            "SELECT count(*) FROM oncebox_jobs WHERE state NOT IN ('done', 'dead', 'cancelled')"
        )
        [(messages,)] = self._rows(
            "SELECT count(*) FROM oncebox_outbox WHERE state NOT IN ('sent', 'dead', 'ambiguous')"
        )
        return int(jobs) + int(messages)
