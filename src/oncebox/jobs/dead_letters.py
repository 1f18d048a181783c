"""Dead letters as an operator acts on them in bulk: which ones a filter names (`DeadFilter`),
what a batch would do — a dry run that writes nothing (`ReplayPlan`, `DiscardPlan`) — and the
planned rows a batch left alone, with why (`Skipped`).

A batch acts on exactly the rows of its plan, by id, each fenced on the attempt count it had
when it was planned (`OperatorAction.if_attempt`): a row replayed or discarded by someone else
since the dry run — or replayed and dead again, a failure the operator has not seen — is
skipped and reported, never acted on twice, and no row the plan did not list is touched. A plan
is a plain frozen value: a console can show it, keep it while a person confirms, and hand it
back to `Operations.replay_planned` or `Operations.discard_planned`.

The filters run in SQL (`JobFilter`, `OutboxFilter`): a dead job's age is its `finished_at`
(when it died), a dead delivery's the end of its last delivery attempt (the one it died of);
a delivery's period is the period of the job that wrote it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.storable import storable_text
from oncebox.store.params import JobFilter, OutboxFilter
from oncebox.store.protocol import Store
from oncebox.store.records import JobRow, OutboxRow

T = TypeVar("T")
Kind = Literal["job", "delivery"]
PAGE = 500  # rows per listing statement while a filter's dead letters are gathered


@dataclass(frozen=True)
class DeadFilter:
    """Which dead letters a listing, a dry run or a batch takes: jobs, deliveries or both (`kind`),
    by task or channel, by a case-insensitive substring of the last error (`error`; SQLite folds
    ASCII letters only), by schedule period (`period`, e.g. "2026-W33"; a delivery's is its
    job's), by how long ago they died (`older_than`, `newer_than`), at most `limit`, newest first.
    """

    kind: Kind | None = None
    task: str | None = None
    channel: str | None = None
    limit: int = 1000
    error: str | None = None
    period: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None

    def __post_init__(self) -> None:
        """Filters that cannot match anything are a mistake, not an empty result."""
        if self.task is not None and (self.channel is not None or self.kind == "delivery"):
            raise ConfigurationError("--task selects dead jobs; it cannot go with deliveries")
        if self.channel is not None and self.kind == "job":
            raise ConfigurationError("--channel selects dead deliveries; it cannot go with jobs")
        if self.limit < 1:
            raise ConfigurationError("the limit must be at least 1")
        if self.error is not None and not self.error.strip():
            raise ConfigurationError("--error is empty: give the text to look for in the error")
        if self.period is not None and not self.period.strip():
            raise ConfigurationError("--period is empty: give a period, e.g. 2026-W33")
        for name, age in (("--older-than", self.older_than), ("--newer-than", self.newer_than)):
            if age is not None and age < timedelta(0):
                raise ConfigurationError(f"{name} cannot be negative")
        if self.newer_than is not None and self.newer_than == timedelta(0):
            raise ConfigurationError("--newer-than 0 matches nothing: nothing died less than 0 ago")
        if (
            self.older_than is not None
            and self.newer_than is not None
            and self.older_than >= self.newer_than
        ):
            raise ConfigurationError(
                f"--older-than {_span(self.older_than)} with --newer-than "
                f"{_span(self.newer_than)} matches nothing: nothing died both that long ago "
                "and that recently"
            )

    @property
    def takes_jobs(self) -> bool:
        return self.kind != "delivery" and self.channel is None

    @property
    def takes_deliveries(self) -> bool:
        return self.kind != "job" and self.task is None


@dataclass(frozen=True)
class DeadLetter:
    """One dead job or dead delivery as a plan lists it. `task` is a job's, `channel` a
    delivery's (the other is None); `attempt` is its attempt count when it was planned (a batch
    acts on it only while it is unchanged); `died_at` when it died."""

    kind: Kind
    id: int
    key: str | None
    task: str | None
    channel: str | None
    last_error: str | None
    attempt: int
    died_at: datetime | None


@dataclass(frozen=True)
class Skipped:
    """A dead letter a dry run or a batch leaves alone, and why (one sentence)."""

    letter: DeadLetter
    why: str


@dataclass(frozen=True)
class ReplayPlan:
    """A dry run of a batch replay: exactly the dead letters it would move (`rows`, newest
    first), read from `planned_at` on (the store's clock); `more` when more match than
    `where.limit`. Nothing was written to make it."""

    where: DeadFilter
    rows: tuple[DeadLetter, ...]
    planned_at: datetime
    more: bool = False

    @property
    def count(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class DiscardPlan:
    """A dry run of a batch discard: the dead letters it would discard (`rows`) and those the
    filter matches but a discard refuses, with why (`refused`: a delivery that may have been
    delivered); `more` when more match than `where.limit`. Nothing was written to make it."""

    where: DeadFilter
    rows: tuple[DeadLetter, ...]
    refused: tuple[Skipped, ...]
    planned_at: datetime
    more: bool = False

    @property
    def count(self) -> int:
        return len(self.rows)


def letter_of(row: JobRow | OutboxRow) -> DeadLetter:
    if isinstance(row, JobRow):
        return DeadLetter(
            "job", row.id, row.key, row.task, None, row.last_error, row.attempt, row.finished_at
        )
    return DeadLetter(
        "delivery",
        row.id,
        row.key,
        None,
        row.channel,
        row.last_error,
        row.attempt,
        row.last_attempt_at,
    )


def discard_refusal(row: OutboxRow) -> str | None:
    """Why a dead message cannot be discarded, or None: one that may have been delivered (an
    unknown outcome, a blind resend) may be with its recipient already."""
    if not (row.uncertain or row.possible_duplicates):
        return None
    return (
        f"cannot discard message {row.id} ({row.key}): it may have been delivered "
        "(an earlier send's outcome is unknown), and a re-run could send it twice; "
        "replay it as it is, or leave it dead"
    )


def list_dead(store: Store, where: DeadFilter) -> list[JobRow | OutboxRow]:
    """Dead jobs and dead outbox rows matching `where`, newest first across both kinds (by when
    they were created), at most `limit`; filtered by the store, a page at a time."""
    found: list[JobRow | OutboxRow] = []
    error = None if where.error is None else storable_text(where.error)
    if where.takes_jobs:
        jobs: list[JobRow] = []
        while len(jobs) < where.limit:
            page = store.job_list(
                JobFilter(
                    state="dead",
                    task=where.task,
                    period=where.period,
                    error=error,
                    older_than=where.older_than,
                    newer_than=where.newer_than,
                    before_id=jobs[-1].id if jobs else None,
                    limit=min(PAGE, where.limit - len(jobs)),
                )
            )
            if not page:
                break
            jobs += page
        found += jobs
    if where.takes_deliveries:
        rows: list[OutboxRow] = []
        while len(rows) < where.limit:
            listed = store.outbox_list(
                OutboxFilter(
                    state="dead",
                    channel=where.channel,
                    period=where.period,
                    error=error,
                    older_than=where.older_than,
                    newer_than=where.newer_than,
                    before_id=rows[-1].id if rows else None,
                    limit=min(PAGE, where.limit - len(rows)),
                )
            )
            if not listed:
                break
            rows += listed
        found += rows
    found.sort(key=lambda row: (row.created_at, row.id), reverse=True)
    return found[: where.limit]


def list_planned(store: Store, where: DeadFilter) -> tuple[list[JobRow | OutboxRow], bool]:
    """What a plan lists: `list_dead`, and whether more than `where.limit` match."""
    rows = list_dead(store, replace(where, limit=where.limit + 1))
    return rows[: where.limit], len(rows) > where.limit


def why_left(store: Store, letter: DeadLetter, verb: str) -> str:
    """Why a batch's `verb` ("replay", "discard") did nothing to a planned row, read back after
    the fenced statement refused it."""
    done = {"replay": "replayed", "discard": "discarded"}[verb]
    if letter.kind == "job":
        job = store.job_get(letter.id)
        if job is None:
            return f"cannot {verb} {letter.id}: job {letter.id} no longer exists"
        if job.state != "dead":
            return (
                f"cannot {verb} {letter.id}: job {letter.id} is {job.state}; "
                f"only dead jobs can be {done}"
            )
        return _died_again(verb, f"job {letter.id}", job.attempt, letter.attempt)
    row = store.outbox_get(letter.id)
    if row is None:
        return f"cannot {verb} message {letter.id}: it no longer exists"
    if row.state != "dead":
        return (
            f"cannot {verb} message {letter.id} ({row.key}): it is {row.state}; "
            f"only dead messages can be {done}"
        )
    refusal = discard_refusal(row) if verb == "discard" else None
    if refusal is not None:
        return refusal
    return _died_again(verb, f"message {letter.id} ({row.key})", row.attempt, letter.attempt)


def _died_again(verb: str, what: str, attempt: int, planned: int) -> str:
    return (
        f"cannot {verb} {what}: it was replayed and died again since the dry run (attempt "
        f"{attempt}, planned at {planned}); its new failure was not confirmed: plan again"
    )


def paced(
    items: Iterable[T],
    per_second: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> Iterator[T]:
    """`items`, at most `per_second` of them a second: a morning-after redrive of a night's
    failures must not arrive at the workers (and the provider) as one burst. A rate that is not
    positive is refused at once, before any item is drawn."""
    return _paced(items, check_rate(per_second), sleep, clock)


def check_rate(per_second: float) -> float:
    """The gap between two paced actions, in seconds; a rate that is not positive is refused."""
    if not per_second > 0:
        raise ConfigurationError("the redrive rate must be positive")
    return 1.0 / per_second


def _paced(
    items: Iterable[T], gap: float, sleep: Callable[[float], None], clock: Callable[[], float]
) -> Iterator[T]:
    next_at = clock()
    for item in items:
        wait = next_at - clock()
        if wait > 0:
            sleep(wait)
        next_at = max(next_at, clock()) + gap
        yield item


def _span(delta: timedelta) -> str:
    """A duration as the CLI takes it: 90m → 1h30m, 2d, 45s."""
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"
