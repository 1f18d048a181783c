"""What the store's operations take: one small dataclass of parameters per operation (noun +
verb, `protocol.py`), and the limits a lease applies as plain data (`LimitPlan`; `jobs/limits.py`
builds it from the tasks' declarations, `allocation.py` shares out what it allows). Domain
outcomes live with their concept and are taken here by shape: an outbox row's end is
`outbox/transitions.py`'s `OutboxFinish`, read through `OutboxFinishParams`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Protocol, get_args

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.storable import checked_text, storable_text
from oncebox.store.records import (
    DeliveryOutcome,
    FinishState,
    JobState,
    OutboxFinishState,
    OutboxRow,
    OutboxState,
    Outcome,
)


@dataclass(frozen=True, slots=True)
class JobInsert:
    """One job to enqueue; `args_json` is already encoded and size-checked."""

    task: str
    key: str | None
    queue: str
    args_json: str
    priority: int
    group_key: str | None
    max_attempts: int
    run_at: datetime | None = None
    delay: timedelta = timedelta(0)
    max_age: timedelta | None = None
    trace_context: str | None = None  # the enqueue span's (oncebox.kernel.tracing)
    limit_key: str | None = None  # a limited task's partition ('' for none: jobs/limits.py)
    collapse: Collapsing | None = None  # a debounced or throttled task's (jobs/debounce.py)
    relayed: bool = False  # its queue's broker delivers it (0016; PostgreSQL)


@dataclass(frozen=True, slots=True)
class Collapsing:
    """How an enqueue joins the pending job of its debounce key, or makes it."""

    key: str  # the debounce key
    throttle: bool  # else a debounce
    window: timedelta
    max_wait: timedelta | None
    keep_last: bool


@dataclass(frozen=True, slots=True)
class ScheduleRunRef:
    """A fan-out run whose count and lease move in the same transaction as its enqueue batch."""

    schedule: str
    period: str
    owner: str
    lease_for: timedelta


# key, args as JSON text, group key, limit key (the partition of a limited task: jobs/limits.py)
InsertRow = tuple[str | None, str, str | None, str | None]


@dataclass(frozen=True, slots=True)
class JobInsertMany:
    """Many jobs of one task, inserted as one set in one transaction; rows are (key, args_json,
    group_key, limit_key), drawn lazily (PostgreSQL sends earlier chunks while later ones are
    drawn; a row that raises rolls the whole set back). With `for_run`, the schedule run's
    enqueued count and lease are updated in the same transaction, so a fan-out killed between
    batches never miscounts what it committed."""

    task: str
    queue: str
    priority: int
    max_attempts: int
    rows: Iterable[InsertRow]
    run_at: datetime | None = None
    delay: timedelta = timedelta(0)
    max_age: timedelta | None = None
    for_run: ScheduleRunRef | None = None
    trace_context: str | None = None  # the enqueue span's, for every row (oncebox.kernel.tracing)
    relayed: bool = False  # its queue's broker delivers them (0016; PostgreSQL)


@dataclass(frozen=True, slots=True)
class JobLeaseParams:
    tasks: Sequence[str]
    queues: Sequence[str]
    limit: int
    worker: str
    token: str
    lease_for: timedelta
    # the limits of the limited tasks among `tasks` (limits/): those are leased through them
    limits: LimitPlan | None = None
    # at most this many of the jobs holding a concurrency limit's slot (None: `limit`)
    slots: int | None = None


@dataclass(frozen=True, slots=True)
class JobReleaseParams:
    """Leased jobs given back unspent, each named with the attempt its lease took (`jobs`: id,
    attempt): the give-back is fenced on both and on `token`, so a lease that ran out and was
    rescued or taken since is not touched."""

    jobs: Sequence[tuple[int, int]]
    token: str
    delay: timedelta = timedelta(0)


@dataclass(slots=True)  # per job: see `LeasedJob`
class JobFinish:
    """How one leased job ends this attempt. `delay` applies when `state` is 'ready'."""

    id: int
    state: FinishState
    outcome: Outcome | None = None
    delay: timedelta = timedelta(0)
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None:
            self.error = storable_text(self.error)


@dataclass(slots=True)  # per job: see `LeasedJob`
class RelayedFinish:
    """How one attempt of a job a broker delivered ends: `run` is the attempt its message
    carried; the row settles only while it is still relayed at the attempt before."""

    id: int
    run: int
    state: FinishState
    outcome: Outcome | None
    delay: timedelta
    error: str | None
    worker: str
    started_at: datetime

    def __post_init__(self) -> None:
        if self.error is not None:
            self.error = storable_text(self.error)


@dataclass(slots=True)  # per job: see `LeasedJob`
class IntentClaim:
    key: str
    task: str
    job_id: int | None


@dataclass(frozen=True, slots=True)
class OperatorAction:
    """An audited operator action on one job (or outbox row: `job_id` is then the row's id).

    `if_attempt`, for a replay or a discard: act only while the row's attempt count is still
    this — the row as an operator confirmed it in a dry run (`oncebox.jobs.dead_letters`), not one
    replayed by someone else and dead again since."""

    job_id: int
    actor: str
    reason: str
    if_attempt: int | None = None

    def __post_init__(self) -> None:  # who and why are written to the audit log
        checked_text(self.actor, "the actor")
        checked_text(self.reason, "the reason")


@dataclass(frozen=True)
class SeenHold:
    """A held outbox row as the resolver judged it, read with its page: its resolution lands
    only on that hold — the row's attempt count and the delivery attempt that recorded the hold
    (every hold records one, so a later hold has a later one) — and only while no provider event
    names the row (each event's own transaction counts it on the row, so a write that waited for
    that transaction sees it)."""

    attempt: int
    held_by: int | None  # the delivery attempt's id

    @classmethod
    def of(cls, row: OutboxRow) -> SeenHold:
        return cls(row.attempt, row.last_attempt_id)


@dataclass(slots=True)  # per job: see `LeasedJob`
class OutboxInsert:
    """One outbox row a handler wrote; inserted with the claim, in the same transaction."""

    key: str
    intent_key: str
    channel: str
    payload_json: str
    token: str
    job_id: int | None
    trace_context: str | None = None  # the span current when the handler wrote it


@dataclass(frozen=True, slots=True)
class OutboxLeaseParams:
    channels: Sequence[str]
    limit: int
    worker: str
    token: str
    lease_for: timedelta


# "discarded" is read back, never written: a dead row an operator discarded (`outbox_discard`).
#: What a wake-up says may have arrived: jobs for the consumers, outbox rows for the dispatcher.
#: Each lane is woken by its own kind only, so an enqueue costs an idle dispatcher nothing.
WorkKind = Literal["jobs", "outbox"]
EVERY_KIND: frozenset[WorkKind] = frozenset(("jobs", "outbox"))
JOBS: frozenset[WorkKind] = frozenset(("jobs",))
OUTBOX: frozenset[WorkKind] = frozenset(("outbox",))


@dataclass(frozen=True, slots=True)
class BucketSpec:
    name: str
    capacity: float
    refill_per_s: float


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    """One verified delivery event from a provider (deliveries/events.py): `event_id` is the
    provider's id of the event (the same on its retries), `stage` where it puts its message
    (None: a kind oncebox does not track, recorded for the dedupe only), `below` the stages it
    goes further than, and `counts` the counters it adds if it is new."""

    channel: str
    event_id: str
    kind: str
    token: str | None
    provider_id: str | None
    occurred_at: datetime | None
    stage: str | None
    below: tuple[str, ...]
    settles: bool = False  # a held message it names is `sent`, unless its stage is in `holding`
    holding: tuple[str, ...] = ()
    reason: str = ""  # the settlement's audited reason


MAX_REASON_CHARS = 2000


def reason_text(reason: str) -> str:
    """An operator's reason as the audit log keeps it: required, trimmed, bounded."""
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigurationError("a reason is required (it is written to the audit log)")
    if len(reason) > MAX_REASON_CHARS:
        raise ConfigurationError(f"the reason is longer than {MAX_REASON_CHARS} characters")
    return checked_text(reason.strip(), "the reason")


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """An audit entry that goes with no change of a row of its own: a refused console login.
    `details` is JSON text (or None); every text in it is the caller's to make inert."""

    actor: str
    action: str
    target_kind: str
    reason: str
    details: str | None = None
    target_key: str | None = None


@dataclass(frozen=True, slots=True)
class Audit:
    """Who did it and why, for an operator action that has no row id of its own."""

    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs `job_list` returns, newest first (by id), at most `limit`, below `before_id`
    (paging). `error` is a case-insensitive substring of the last error (SQLite folds ASCII
    letters only); `older_than` / `newer_than` keep jobs that finished — a dead job: died — at
    least / less than that long ago by the store's clock (a job not finished matches neither)."""

    state: JobState | None = None
    task: str | None = None
    queue: str | None = None
    schedule: str | None = None
    period: str | None = None
    before_id: int | None = None
    limit: int = 50
    error: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    key_prefix: str | None = None  # keys that start with it (not cancelled: see job_list)


@dataclass(frozen=True, slots=True)
class OutboxFilter:
    """Which outbox rows `outbox_list` returns, newest first (by id), at most `limit`, below
    `before_id`. `error` as for jobs; `period`: rows written by a job of that schedule period;
    `older_than` / `newer_than`: the row's last delivery attempt — a dead row's: the one it died
    of; a sent row whose attempts retention pruned: its send — ended at least / less than that
    long ago (a row never attempted matches neither)."""

    state: OutboxState | None = None
    channel: str | None = None
    before_id: int | None = None
    limit: int = 50
    error: str | None = None
    period: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    key_prefix: str | None = None  # the row's own key starts with it
    reported: str | None = None  # the furthest stage its provider's reports reached


@dataclass(frozen=True, slots=True)
class AuditFilter:
    target_id: int | None = None
    action: str | None = None
    key: str | None = None
    before_id: int | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class KeyCanary:
    """What a task's key template or a schedule's period function produced on the canary inputs
    (see `oncebox.jobs.keyguard`)."""

    kind: Literal["task", "schedule"]
    name: str
    source: str
    outputs: tuple[str, ...]
    recorded_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LimitDeclaration:
    """A task's limits as a process's code declares them (`jobs/declarations.py`): `limits`
    is their canonical JSON text; `declared_at` when a process last declared them (read back
    from the store)."""

    task: str
    limits: str
    declared_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """A worker process as it announces itself: what it serves."""

    name: str
    host: str
    pid: int
    tasks: tuple[str, ...]
    queues: tuple[str, ...]
    channels: tuple[str, ...]


#: The kinds of rows retention acts on (`retention/policy.py`): `payloads` thins sent messages
#: (their payload dropped, the row kept); every other kind deletes rows.
PruneKind = Literal[
    "jobs",
    "intents",
    "payloads",
    "messages",
    "delivery_attempts",
    "provider_events",
    "audit",
    "schedule_runs",
]
PRUNE_KINDS: tuple[PruneKind, ...] = get_args(PruneKind)


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """Session settings for a consumer connection.

    `lock_timeout` bounds how long a claim waits on a key another live transaction is claiming;
    `transaction_timeout` bounds a handler's transaction on the server (PostgreSQL's
    idle-in-transaction and statement timeouts), so a hung handler releases its locks.
    """

    lock_timeout: timedelta
    transaction_timeout: timedelta
    application_name: str = "oncebox-consumer"


def insert_chunks(rows: Iterable[InsertRow], count: int, chars: int) -> Iterator[list[InsertRow]]:
    """`rows` in chunks of at most `count` rows and about `chars` characters of arguments, drawn
    lazily: the caller sends one chunk while the next is still being encoded, and one statement's
    parameter stays far below the server's 1 GB limit even when every job is at the size limit."""
    chunk: list[InsertRow] = []
    size = 0
    for row in rows:
        chunk.append(row)
        size += len(row[1])
        if len(chunk) >= count or size >= chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


@dataclass(frozen=True, slots=True)
class LimitRule:
    """One limit as the lease applies it: a slot count and/or a bucket, for the whole of its
    tasks or per partition. `tasks` are every task that declares it: the slots in use are
    counted over all of them."""

    name: str
    concurrency: int | None
    capacity: float | None  # a rate's bucket
    refill_per_s: float | None
    per_partition: bool
    tasks: tuple[str, ...]
    shown: str = ""  # as people wrote it: "4 at once", "100/min"


@dataclass(frozen=True, slots=True)
class LimitPlan:
    """The limits a lease applies: each limited task's rules, by name."""

    rules: Mapping[str, LimitRule]
    tasks: Mapping[str, tuple[str, ...]]  # task -> names of its rules

    def rules_of(self, task: str) -> list[LimitRule]:
        return [self.rules[name] for name in self.tasks.get(task, ())]

    def only(self, tasks: Iterable[str]) -> LimitPlan:
        """The plan for a worker serving `tasks` (its rules still count every task)."""
        wanted = set(tasks)
        served = {task: names for task, names in self.tasks.items() if task in wanted}
        return LimitPlan(
            {name: self.rules[name] for names in served.values() for name in names}, served
        )

    def __bool__(self) -> bool:
        return bool(self.tasks)


class OutboxFinishParams(Protocol):
    """How one leased outbox row ends, as `outbox_finish` writes it: the outbox's own outcome
    (`outbox/transitions.py`'s `OutboxFinish`, built by its named transitions) read by shape, so
    the state machine lives with its concept and the store below it.

    `outcome` is the delivery-attempt record to write (None: no send was attempted);
    `counts_attempt` spends one of the channel's attempts; `possible_duplicate` counts a resend
    after an unknown outcome; `uncertain` sets (True/False) or leaves (None) the row's flag;
    `rescued` counts a dispatcher's lease that ran out on the row."""

    @property
    def id(self) -> int: ...
    @property
    def state(self) -> OutboxFinishState: ...
    @property
    def outcome(self) -> DeliveryOutcome | None: ...
    @property
    def counts_attempt(self) -> bool: ...
    @property
    def delay(self) -> timedelta: ...
    @property
    def error(self) -> str | None: ...
    @property
    def receipt(self) -> str | None: ...
    @property
    def possible_duplicate(self) -> bool: ...
    @property
    def uncertain(self) -> bool | None: ...
    @property
    def rescued(self) -> bool: ...
