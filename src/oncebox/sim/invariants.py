"""What must hold, written once as docs/guarantees.md states it, read after every step and once
the world is quiet.

The checker reads the database with its own SQL, between steps (every actor parked), as an
observer independent of the store's statements. Here are the invariants of every world; each
part of the world (`sim/parts/`) adds its own, which the checker asks for too. After every step:

    S1  at most one intent per key
    F1  a leased job or message is leased by one lease: its token and its deadline set together
    C1  the durable counters equal a recount of what the rows went through: every job enqueued
        counted once, every arrival of a job at done counted once as completed or as a duplicate
        (a writer fenced out counts nothing; a job re-opened when its last message was discarded
        and run again counts again; a job the pruner deleted stays counted); what a part counts
        with no job row (`counted`: a broker's unrecorded messages) within the part's bounds

Once faults stop and the lanes have run until nothing is due (`quiet`):

    L1  every key an enqueue asked for has a job, and every job and message is at an end —
        done, dead or cancelled; sent, dead, held (`ambiguous`) or discarded — each visible
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

JOB_ENDS = frozenset({"done", "dead", "cancelled"})
MESSAGE_ENDS = frozenset({"sent", "dead", "ambiguous", "discarded"})


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"


class Checks(Protocol):
    """A part's own invariants (`sim/parts/`), given the checker's read: SQL in, rows out."""

    def after_step(self, rows: Callable[[str], list[Any]]) -> list[Violation]: ...

    def quiet(self, rows: Callable[[str], list[Any]]) -> list[Violation]: ...

    def faults_stop(self) -> None: ...

    def unfinished(self, rows: Callable[[str], list[Any]]) -> int: ...


class Checker:
    """See the module docstring. `connection` is the checker's own, outside every actor.

    Most steps commit nothing: an actor waiting for its turn at SQLite's write lock, a lane
    finding no work, a statement inside a transaction still open. So a read is kept until the
    database says something committed since (`version`: SQLite's `data_version`, PostgreSQL's
    snapshot), and the same SQL is answered from it: the checker's reads name no time and no
    random, so on the same committed data they return the same rows."""

    def __init__(
        self,
        connection: Any,
        parts: Sequence[Checks] = (),
        version: Callable[[Any], object] | None = None,
    ) -> None:
        self.connection = connection
        self.parts = list(parts)
        self._version = version
        self._seen: object = None
        self._kept: dict[str, list[Any]] = {}
        self._jobs: dict[int, tuple[str, Any]] = {}  # every job as last seen: (state, outcome)
        self._arrived: Counter[tuple[str, Any]] = Counter()  # arrivals at each (state, outcome)
        self._ever = 0  # jobs ever seen
        self._gone: set[int] = set()  # the jobs the pruner deleted
        self._keys: dict[int, Any] = {}
        self.pruned_keys: set[Any] = set()  # the keys of the jobs the pruner deleted

    def faults_stop(self) -> None:
        """The quiet phase begins: each part may start checking what holds only without faults
        (a lost connection gives a batch back unspent, so before it some counts are unbounded)."""
        for part in self.parts:
            part.faults_stop()

    def _refresh(self) -> None:
        """Forget the kept reads if anything committed since they were made."""
        if self._version is None:
            self._kept = {}
            return
        version = self._version(self.connection)
        if version != self._seen:
            self._seen, self._kept = version, {}

    def _rows(self, sql: str) -> list[Any]:
        kept = self._kept.get(sql)
        if kept is None:
            kept = self._kept[sql] = self._read(sql)
        return list(kept)

    def _read(self, sql: str) -> list[Any]:
        cursor = self.connection.execute(sql)
        rows = list(cursor.fetchall())
        commit = getattr(self.connection, "commit", None)
        if callable(commit) and not getattr(self.connection, "autocommit", True):
            commit()
        return rows

    def after_step(self) -> list[Violation]:
        self._refresh()
        found: list[Violation] = []
        for key, count in self._rows(
            "SELECT key, count(*) FROM oncebox_intents GROUP BY key HAVING count(*) > 1"
        ):
            found.append(Violation("S1", f"{count} intents for {key}"))
        for kind, table in (("job", "oncebox_jobs"), ("message", "oncebox_outbox")):
            for row_id, state in self._rows(
                f"SELECT id, state FROM {table} WHERE (lease_token IS NULL) <> "
                "(lease_expires_at IS NULL)"
            ):
                found.append(Violation("F1", f"{kind} {row_id} ({state}): a half-written lease"))
        found += self._counted()
        for part in self.parts:
            found += part.after_step(self._rows)
        return found

    def _counted(self) -> list[Violation]:
        """The counters against what the rows went through. They count events: a job that
        completed, was re-opened (its last message discarded) and completed again counts twice,
        and a job the pruner deleted stays counted. The checker sees every commit (it reads after
        every step), so each arrival of a job at an outcome is seen once."""
        counters = dict(self._rows("SELECT name, sum(value) FROM oncebox_counters GROUP BY name"))
        read = self._rows("SELECT id, key, state, outcome FROM oncebox_all_jobs")
        jobs = {int(job_id): (str(state), outcome) for job_id, _key, state, outcome in read}
        for job_id, key, _state, _outcome in read:
            if int(job_id) not in self._jobs and int(job_id) not in self._gone:
                self._ever += 1
            if jobs[int(job_id)] != self._jobs.get(int(job_id)):
                self._arrived[jobs[int(job_id)]] += 1
            self._keys[int(job_id)] = key
        for job_id in set(self._jobs) - set(jobs):  # pruned: finished, never to change again
            self._gone.add(job_id)
            self.pruned_keys.add(self._keys.pop(job_id))
        self._jobs = jobs
        found = []
        # what parts count with no job row (a broker's unrecorded messages): at least, at most
        beyond: dict[str, tuple[int, int]] = {}
        for part in self.parts:
            for name, (low, high) in getattr(part, "counted", lambda _rows: {})(self._rows).items():
                was = beyond.get(name, (0, 0))
                beyond[name] = (was[0] + low, was[1] + high)
        for name, recount in (
            ("jobs_enqueued", self._ever),
            ("jobs_completed", self._arrived[("done", "completed")]),
            ("claim_conflicts", self._arrived[("done", "duplicate")]),
        ):
            low, high = beyond.get(name, (0, 0))
            counted = int(counters.get(name) or 0)
            if not recount + low <= counted <= recount + high:
                more = "" if (low, high) == (0, 0) else f" and {low}..{high} with no row"
                found.append(Violation("C1", f"{name} counts {counted}, the rows {recount}{more}"))
        return found

    def quiet(self, wanted: set[str]) -> list[Violation]:
        self._refresh()
        found: list[Violation] = []
        jobs = self._rows("SELECT id, key, state FROM oncebox_all_jobs")
        keys = {key for _, key, _ in jobs} | self.pruned_keys  # a pruned job ended first
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
        for part in self.parts:
            found += part.quiet(self._rows)
        return found

    def unfinished(self) -> int:
        """Jobs and messages not yet at an end, and what the parts say is not (a fan-out still
        running, a broker's messages: `Part.unfinished`): the drain goes on while there are any."""
        self._refresh()
        [(jobs,)] = self._rows(
            "SELECT count(*) FROM oncebox_all_jobs WHERE state NOT IN ('done', 'dead', 'cancelled')"
        )
        [(messages,)] = self._rows(
            "SELECT count(*) FROM oncebox_outbox WHERE state NOT IN ('sent', 'dead', 'ambiguous')"
        )
        return int(jobs) + int(messages) + sum(part.unfinished(self._rows) for part in self.parts)


def sqlite_version(connection: Any) -> object:
    """Changes whenever another connection commits to the file (the checker never writes)."""
    return connection.execute("PRAGMA data_version").fetchone()[0]


def postgres_version(connection: Any) -> object:
    """The server's snapshot: any transaction that wrote and committed since the last look
    changed it (an xid assigned moves `xmax`; a commit leaves the in-progress list). It is the
    whole server's, so another database's writes make it change too: a read made again for
    nothing, never a change missed."""
    row = connection.execute("SELECT pg_current_snapshot()::text").fetchone()
    if not getattr(connection, "autocommit", True):
        connection.commit()
    return row[0]
