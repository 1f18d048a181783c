"""The `Store` protocol: every database operation oncebox performs, by name.

Internal: this interface may change between releases. Each operation is named noun + verb and
takes a small frozen dataclass of parameters. Time is never a parameter: every operation reads
the store's own clock (`oncebox_now()`), so all processes share one notion of time. Two
implementations exist, `store/sqlite.py` and `store/postgres.py`; one conformance suite
(`tests/store_contract/`) runs against both.

Connections: a `Store` hands out short-lived connections per operation. The consumer lane gets a
`ConsumerSession` instead — one dedicated connection that leases jobs and runs the consumer
transaction, in which the handler runs on the same connection as the claim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar, get_args

from oncebox.kernel.clock import ClockSetting
from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.storable import checked_text
from oncebox.limits.plan import LimitedPartition, LimitPlan

T = TypeVar("T")

JobState = Literal["ready", "leased", "relayed", "done", "dead", "cancelled"]
FinishState = Literal["done", "ready", "dead"]
Outcome = Literal["completed", "duplicate"]
RELAY_NEEDS_POSTGRES = (
    "a queue a broker holds keeps its jobs' records on PostgreSQL: on SQLite, publish to it "
    "with box.publish_unrecorded, or leave the queue to the table"
)
ACTIVE_STATES: tuple[JobState, ...] = ("ready", "leased", "relayed", "dead")


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


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
class InsertManyResult:
    created: list[tuple[int, str | None]]
    offered: int  # rows drawn from `JobInsertMany.rows`
    run_held: bool = True  # False: `for_run` was taken over by another scheduler


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
class DueTime:
    """When the earliest ready job (or pending outbox row) falls due (`at`; None when there is
    none), and the store's time `now` when that was read: the wait is their difference, with no
    clock read of its own."""

    at: datetime | None
    now: datetime

    def seconds(self) -> float | None:
        return None if self.at is None else (self.at - self.now).total_seconds()


@dataclass(frozen=True, slots=True)
class JobReleaseParams:
    """Leased jobs given back unspent, each named with the attempt its lease took (`jobs`: id,
    attempt): the give-back is fenced on both and on `token`, so a lease that ran out and was
    rescued or taken since is not touched."""

    jobs: Sequence[tuple[int, int]]
    token: str
    delay: timedelta = timedelta(0)


def storable_text(text: str) -> str:
    """`text` as both stores can keep it: a NUL written as ``\\0`` (PostgreSQL's text cannot
    hold one), a lone surrogate (bytes decoded with ``surrogateescape``, e.g. a file name) as its
    backslash escape (it is not Unicode, so neither UTF-8 nor JSON can carry it). An error message
    from a handler or a provider is whatever they raised: writing it must not fail the write
    that records the outcome."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


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


@dataclass(frozen=True, slots=True)
class RelayedRow:
    """What the broker consumer reads of a delivered job before running it."""

    id: int
    state: JobState
    attempt: int
    attempt_base: int
    max_attempts: int
    key: str | None
    expires_at: datetime | None
    trace_context: str | None


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

OutboxState = Literal["pending", "leased", "sending", "sent", "dead", "ambiguous", "discarded"]
OutboxFinishState = Literal["sent", "pending", "dead", "ambiguous"]
DeliveryOutcome = Literal[
    "sent", "failed", "throttled", "dead", "ambiguous", "resent", "lease_expired"
]


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


@dataclass(frozen=True, slots=True)
class BucketSpec:
    name: str
    capacity: float
    refill_per_s: float


@dataclass(frozen=True)
class BucketState:
    """One token bucket as the store keeps it; `outbox.ratelimit.take` decides from it."""

    name: str
    capacity: float
    refill_per_s: float
    tokens: float
    updated_at: datetime

    def level(self, now: datetime) -> float:
        elapsed = max((now - self.updated_at).total_seconds(), 0.0)
        return min(self.capacity, self.tokens + elapsed * self.refill_per_s)


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


@dataclass(frozen=True, slots=True)
class ProviderEventRecorded:
    """What recording an event did: `duplicate` (seen before), `unmatched` (no message of this
    database), or `recorded` against `outbox_id`, whose state it found, whether the event moved
    its stage (`advanced`) and settled it (`settled`)."""

    outcome: Literal["recorded", "duplicate", "unmatched"]
    outbox_id: int | None = None
    state: str | None = None
    advanced: bool = False
    settled: bool = False  # the held message it named is now `sent`


@dataclass(frozen=True, slots=True)
class ReportedHold:
    """A held message and the first event that says its provider took it."""

    id: int
    channel: str
    kind: str
    provider_id: str | None
    event_id: str


@dataclass(frozen=True, slots=True)
class ProviderEventRow:
    id: int
    channel: str
    event_id: str
    kind: str
    token: str | None
    provider_id: str | None
    outbox_id: int | None
    occurred_at: datetime | None
    received_at: datetime


@dataclass(frozen=True, slots=True)
class ApiKeyRow:
    """An HTTP API key as the store keeps it: its secret's digest only (api/keys.py)."""

    id: int
    name: str
    scopes: str  # space-separated: enqueue, read, operate
    secret_sha256: str
    rate: str  # the key's request budget, e.g. "20/s"
    created_at: datetime
    created_by: str
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class ApiRequestRow:
    """An Idempotency-Key record: the request holding it (`claim`) while `status` is None, kept
    by it until `held_until` (renewed while it runs; None: an older server's record), then the
    first answer, replayed until `expires_at` (api/idempotency.py)."""

    api_key_id: int
    idempotency_key: str
    fingerprint: str
    claim: str
    status: int | None
    response: str | None
    started_at: datetime
    expires_at: datetime
    held_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class ApiRequestClaim:
    """Hold `idempotency_key` for a request: kept `retain` after it starts, held `hold` from now
    (the holder renews that while it runs); taken over from an in-flight holder of the same body
    whose hold ran out."""

    api_key_id: int
    idempotency_key: str
    fingerprint: str
    claim: str
    retain: timedelta
    hold: timedelta


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnqueueConflict:
    """Why an insert wrote nothing: the active job holding the key and/or the key's intent."""

    active_job_id: int | None
    active_state: JobState | None
    intent_job_id: int | None
    intent_claimed_at: datetime | None

    @property
    def found(self) -> bool:
        return self.active_job_id is not None or self.intent_claimed_at is not None


@dataclass(slots=True)
class LeasedJob:
    """Not frozen, like the other records built once per job or message on the lanes' paths
    (claims, outbox rows, settlements, leased messages and their outcomes): a frozen dataclass
    sets each field through `object.__setattr__`, five times slower, and nothing here is
    mutated after it is built."""

    id: int
    key: str | None
    task: str
    args_json: str
    attempt: int
    max_attempts: int
    attempt_base: int
    priority: int
    run_at: datetime
    expires_at: datetime | None
    leased_at: datetime
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class RescuedJob:
    id: int
    key: str | None
    task: str
    state: JobState
    attempt: int
    worker: str | None


@dataclass(frozen=True, slots=True)
class JobRow:
    id: int
    key: str | None
    task: str
    queue: str
    args_json: str
    state: JobState
    outcome: Outcome | None
    priority: int
    group_key: str | None
    attempt: int
    max_attempts: int
    attempt_base: int
    run_at: datetime
    expires_at: datetime | None
    created_at: datetime
    leased_by: str | None
    leased_at: datetime | None
    lease_expires_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    schedule: str | None = None  # the fan-out that enqueued it, if one did
    period: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    job_id: int
    attempt: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime
    outcome: str
    error: str | None
    note: str | None


@dataclass(frozen=True, slots=True)
class IntentRow:
    key: str
    task: str
    job_id: int | None
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    at: datetime
    actor: str
    action: str
    target_kind: str
    target_id: int | None
    target_key: str | None
    reason: str
    details: str | None


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
class ActionResult:
    """A replay or cancel that happened: the job and the audit row written with it."""

    job_id: int
    key: str | None
    audit_id: int


@dataclass(frozen=True, slots=True)
class DiscardResult:
    """A dead message discarded, and what it freed: its key (renamed `renamed`), its intent once
    no other message of it stands (`kept` names those that do), and its job, dead again so a
    replay re-runs it (`job_reopened`)."""

    id: int
    key: str
    renamed: str
    intent_key: str
    kept: tuple[tuple[str, str], ...]
    intent_released: bool
    job_reopened: int | None
    audit_id: int


@dataclass(slots=True)  # per message: see `LeasedJob`
class OutboxLeased:
    id: int
    key: str
    intent_key: str
    channel: str
    payload_json: str
    token: str
    attempt: int
    attempt_base: int
    possible_duplicates: int
    first_leased_at: datetime
    leased_at: datetime
    lease_token: str
    uncertain: bool = False
    rescues: int = 0  # leases that ran out on it before: a suspect (see the dispatcher)
    trace_context: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    key: str
    intent_key: str
    channel: str
    payload_json: str
    token: str
    job_id: int | None
    state: OutboxState
    attempt: int
    attempt_base: int
    possible_duplicates: int
    next_attempt_at: datetime
    created_at: datetime
    first_leased_at: datetime | None
    leased_by: str | None
    lease_token: str | None
    lease_expires_at: datetime | None
    sent_at: datetime | None
    receipt: str | None
    last_error: str | None
    uncertain: bool = False
    rescues: int = 0  # leases that ran out on it with no outcome recorded (read by the rescue)
    # when retention dropped its payload (kept as {}); None: the payload is held
    payload_dropped_at: datetime | None = None
    # the furthest stage its provider's reports reached (deliveries/events.py), and when
    reported: str | None = None
    reported_at: datetime | None = None
    # when its last delivery attempt ended (a dead row: when it died; a held one: when it was
    # held); read by the listing (`outbox_list`) and `outbox_ambiguous_list` only
    last_attempt_at: datetime | None = None
    # the delivery attempt that recorded its hold, and how many provider events named it; read
    # by `outbox_ambiguous_list` only
    last_attempt_id: int | None = None
    events: int = 0


@dataclass(frozen=True, slots=True)
class DeliveryAttemptRow:
    outbox_id: int
    attempt: int
    worker: str | None
    started_at: datetime | None
    finished_at: datetime
    outcome: str
    error: str | None
    receipt: str | None


@dataclass(frozen=True, slots=True)
class ScheduleState:
    paused: bool
    last_fire_at: datetime | None
    now: datetime


@dataclass(frozen=True, slots=True)
class ScheduleRunClaim:
    """Take a period's fan-out (new, abandoned by a dead owner, or — `rescan` — finished)."""

    schedule: str
    period: str
    fire_at: datetime | None
    owner: str
    lease_for: timedelta
    late: bool = False
    rescan: bool = False


@dataclass(frozen=True, slots=True)
class ScheduleRunRow:
    schedule: str
    period: str
    fire_at: datetime | None
    state: Literal["running", "done"]
    owner: str | None
    lease_expires_at: datetime | None
    started_at: datetime
    finished_at: datetime | None
    scans: int
    eligible_count: int | None
    enqueued_count: int
    late: bool
    renewed_at: datetime | None = None  # its owner's last sign of life (schedules/owners.py)


@dataclass(frozen=True, slots=True)
class ScheduleRunTakeOver:
    """An operator takes a running fan-out whose owner is gone — only while the run is still as
    they read it (`seen_*`) — audited with `actor` and `reason`."""

    schedule: str
    period: str
    owner: str
    lease_for: timedelta
    seen_owner: str
    seen_lease_expires_at: datetime
    seen_renewed_at: datetime | None
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class PeriodStats:
    """One schedule period's coverage: the latest scan's eligible count against where the jobs
    its fan-outs enqueued, and their messages, are now."""

    period: str
    state: Literal["running", "done"]
    eligible: int | None
    enqueued: int
    done: int
    covered: int  # done, with every message it wrote sent
    sent: int
    pending: int  # jobs ready or leased, messages not yet final
    dead: int  # jobs and messages
    ambiguous: int
    fire_at: datetime | None = None  # the fire this period's fan-out served (None: by hand)
    on_time: int | None = None  # covered within the SLO's window (None: no SLO or no fire)
    dead_subjects: int = 0  # jobs dead, or with a dead message (`dead` counts messages too)
    held_subjects: int = 0  # jobs not dead with a message held ambiguous
    pruned: int = 0  # done jobs pruned, counted as their run's summary kept them (job_prune)
    duplicates: int = 0  # possible duplicate sends among its messages still kept
    # a running fan-out's owner, its lease and its last renewal (None when done)
    owner: str | None = None
    lease_expires_at: datetime | None = None
    renewed_at: datetime | None = None
    started_at: datetime | None = None

    @property
    def coverage(self) -> float | None:
        """Covered jobs over eligible, at most 1 (a re-scan that finds fewer eligible than the
        jobs already covered). Keys claimed before the fan-out are not counted."""
        return None if not self.eligible else min(self.covered, self.eligible) / self.eligible


@dataclass(frozen=True, slots=True)
class PeriodPace:
    """How fast one period's jobs were done: `done` completed between `first_at` (the first
    lease) and `last_at` (the last completion), by `lanes` consumer lanes."""

    done: int
    first_at: datetime | None
    last_at: datetime | None
    lanes: int


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
class StatusTimes:
    oldest_due_ready: datetime | None
    next_ready: datetime | None
    next_pending_message: datetime | None
    oldest_pending_message: datetime | None
    next_job_lease_end: datetime | None
    next_message_lease_end: datetime | None
    now: datetime
    jobs_past_lease: int = 0  # leased jobs whose lease ran out, not yet rescued
    messages_past_lease: int = 0  # leased or sending messages likewise

    def next_event(self) -> datetime | None:
        """When something will next become workable without anyone enqueueing anything."""
        candidates = [
            self.next_ready,
            self.next_pending_message,
            self.next_job_lease_end,
            self.next_message_lease_end,
        ]
        return min((c for c in candidates if c is not None), default=None)


@dataclass(frozen=True, slots=True)
class BacklogRow:
    """Work not finished, for one task (`kind` "job") or one channel ("message"): how much
    waits and when the first of it falls due; how much a lease holds and when the first of those
    leases runs out (then the rescuer makes it workable again)."""

    kind: Literal["job", "message"]
    name: str
    waiting: int
    next_due_at: datetime | None
    held: int
    held_until: datetime | None

    def next_at(self) -> datetime | None:
        """When some of it can next be worked on, without anyone enqueueing anything."""
        times = [t for t in (self.next_due_at, self.held_until) if t is not None]
        return min(times, default=None)


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """A worker process as it announces itself: what it serves."""

    name: str
    host: str
    pid: int
    tasks: tuple[str, ...]
    queues: tuple[str, ...]
    channels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    name: str
    host: str
    pid: int
    tasks: tuple[str, ...]
    queues: tuple[str, ...]
    channels: tuple[str, ...]
    started_at: datetime
    seen_at: datetime
    stopped_at: datetime | None
    live: bool


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Which migrations are applied, against which this code knows."""

    applied: tuple[int, ...]
    known: tuple[int, ...]

    @property
    def current(self) -> int:
        return max(self.applied, default=0)

    @property
    def required(self) -> int:
        return max(self.known, default=0)

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(v for v in self.known if v not in self.applied)

    @property
    def unknown(self) -> tuple[int, ...]:
        return tuple(v for v in self.applied if v not in self.known)


@dataclass(frozen=True, slots=True)
class StateCounts:
    """Jobs per state; done jobs split by outcome."""

    counts: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, name: str) -> int:
        return self.counts.get(name, 0)


# What the lanes decide between a store's read and its write, in the store's transaction: the
# outbox rescue settles rows whose lease expired (given the rows and the time); the rate limiter
# takes tokens (given the channel's buckets, the time and the channel's pause; returning the
# buckets to write back and its verdict).
RescueDecision = Callable[[list[OutboxRow], datetime], list[OutboxFinish]]
BucketDecision = Callable[
    [list[BucketState], datetime, datetime | None], tuple[list[BucketState], T]
]


# ---------------------------------------------------------------------------------------------
# Protocols
# ---------------------------------------------------------------------------------------------


class HandlerConnection(Protocol):
    """What a handler receives as `ctx.connection`: the claim's connection, guarded.

    It forwards to the driver's connection (sqlite3 or psycopg), so handlers use the driver's
    normal API. It refuses commit, rollback, close and transaction-control SQL, and opens a
    savepoint the first time the handler uses it, so a failing handler's writes are undone
    without undoing the rest of the batch.
    """

    def __getattr__(self, name: str) -> Any: ...


class ConsumerTx(Protocol):
    """One consumer transaction: claims, handlers' writes and settlements commit together."""

    def intent_claim(self, claims: Sequence[IntentClaim]) -> set[str]:
        """Insert the claims' intents; return the keys this transaction claimed.

        A key already claimed (committed by anyone, ever) is absent from the result. On PostgreSQL,
        a key another live transaction is claiming makes this raise `ClaimLockTimeout` after the
        session's lock_timeout; the transaction is then unusable and must be rolled back.
        """
        ...

    def intent_owners(self, keys: Sequence[str]) -> dict[str, int | None]:
        """The job that claimed each of these keys (None for broker deliveries)."""
        ...

    def intent_release(self, keys: Sequence[str]) -> None:
        """Delete intents this same transaction claimed (handler failed or was not run)."""
        ...

    def handler_scope(self) -> AbstractContextManager[HandlerConnection]:
        """A guarded connection for one handler; its writes are undone if the block raises."""
        ...

    def outbox_insert(self, rows: Sequence[OutboxInsert]) -> None:
        """Insert the handlers' buffered outbox rows as one set, in this transaction."""
        ...

    def job_finish(self, token: str, finishes: Sequence[JobFinish]) -> set[int]:
        """Settle jobs leased under `token`, fenced; return the ids settled (and counted)."""
        ...

    def job_settle_relayed(self, finishes: Sequence[RelayedFinish]) -> set[int]:
        """Settle jobs a broker delivered, each fenced on its attempt; return the ids settled
        (PostgreSQL: 0016)."""
        ...

    def counter_add(self, deltas: Mapping[str, int]) -> None:
        """Add to durable counters in this transaction: for a transport whose settlements
        write no job rows (`oncebox.kernel.counters.settlement_counts`)."""
        ...


class ConsumerSession(Protocol):
    """A dedicated connection for one consumer thread."""

    dialect: str

    def job_lease(self, params: JobLeaseParams) -> list[LeasedJob]: ...

    def job_release(self, params: JobReleaseParams) -> int: ...

    def due_seen(self) -> DueTime | None:
        """The next due time, if the last lease read it on its way (PostgreSQL folds the read
        into the lease's round trip and transaction when the queue is running dry); None: ask
        the store. Taken once: a second call returns None."""
        ...

    def transaction(self) -> AbstractContextManager[ConsumerTx]:
        """Begin a consumer transaction; commit when the block exits normally, else roll back."""
        ...

    def close(self) -> None: ...


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
class Held:
    """What retention holds of one kind of row for one name (task, channel, schedule, or ''):
    when the oldest row it still keeps happened, and how many rows are past their retention
    (counted up to a limit) — waiting for the pruner."""

    oldest: datetime | None
    waiting: int


class Store(Protocol):
    """Every operation oncebox performs on its database."""

    url: str

    @property
    def dialect(self) -> Literal["sqlite", "postgres"]: ...

    @property
    def supports_notifications(self) -> bool:
        """Whether `wait_for_work` can tell that work may have arrived (PostgreSQL: a NOTIFY;
        SQLite: a commit seen in the database files), so idle lanes poll only as a fallback."""
        ...

    def close(self) -> None: ...

    # schema
    def schema_status(self) -> SchemaStatus: ...
    def schema_migrate(self, connection: object | None = None) -> list[int]: ...

    # clock
    def clock_now(self) -> datetime: ...
    def clock_set(self, setting: ClockSetting, audit: Audit | None = None) -> None:
        """Write the shared clock setting; with `audit`, an operator's change, in the audit log
        (`details`: what the setting was)."""
        ...

    def clock_get(self) -> ClockSetting: ...

    # jobs
    def job_insert(self, job: JobInsert, connection: object | None = None) -> tuple[int, bool]:
        """Insert unless deduplicated; returns (job id or 0, created)."""
        ...

    def job_merge(
        self, job: JobInsert, connection: object | None = None
    ) -> tuple[int, str | None] | None:
        """Join the pending job of the debounce key of `job` (`job.collapse`); its id and key
        after the merge, or None when there is none to join."""
        ...

    def job_insert_many(
        self, jobs: JobInsertMany, connection: object | None = None
    ) -> InsertManyResult: ...
    def job_enqueue_conflict(
        self, key: str, connection: object | None = None
    ) -> EnqueueConflict: ...

    def job_unlimit(self, tasks: Sequence[str], limit: int, declared_within: timedelta) -> int:
        """Ready jobs of `tasks` (declared without limits by the caller's code) that carry a
        partition lose it, up to `limit` of them — only those of a task no process has declared
        limited (`limit_declare`) within `declared_within`; how many did."""
        ...

    def limit_declare(
        self, declared: Sequence[LimitDeclaration], connection: object | None = None
    ) -> None:
        """Record that this process's code limits these tasks so, now (in the caller's
        transaction on `connection`)."""
        ...

    def limit_declaration_list(self) -> list[LimitDeclaration]: ...

    def job_lease_extend(self, tokens: Sequence[str], lease_for: timedelta) -> int: ...
    def job_rescue_expired(self, limit: int) -> list[RescuedJob]: ...
    def job_attempt_note(self, job_id: int, attempt: int, worker: str, note: str) -> None: ...
    def job_relay_check(self, ids: Sequence[int]) -> dict[int, RelayedRow]:
        """The rows of jobs a broker delivered (PostgreSQL: 0016)."""
        ...

    def job_relay_adopt(self, queues: Sequence[str], tasks: Sequence[str], limit: int) -> int:
        """Make ready jobs of these broker-held queues relayed, up to `limit` (PostgreSQL)."""
        ...

    def job_bury_relayed(self, finishes: Sequence[RelayedFinish]) -> set[int]:
        """Relayed jobs whose broker gave up delivering their message (SQS's redrive, JetStream's
        `MaxDeliver`), made dead — fenced on the attempt as a consumer's settlement is, so a
        copy that lost its race buries nothing; the ids that moved (PostgreSQL)."""
        ...

    def job_replay(self, action: OperatorAction) -> ActionResult | None: ...
    def job_cancel(self, action: OperatorAction) -> ActionResult | None: ...
    def job_discard(self, action: OperatorAction) -> ActionResult | None:
        """A dead job an operator abandons: dead → cancelled in place (attempts kept, the key
        free for a new enqueue), audited as `discard` in the same transaction; None unless the
        job is dead (and, with `if_attempt`, still at that attempt count)."""
        ...

    def job_get(self, job_id: int) -> JobRow | None: ...
    def job_find_by_key(self, key: str) -> list[JobRow]: ...
    def job_attempt_list(self, job_id: int) -> list[AttemptRow]: ...
    def job_count_by_state(self) -> StateCounts: ...
    def counter_add(self, deltas: Mapping[str, int]) -> None:
        """Add to durable counters (`oncebox.kernel.counters`) in a transaction of their own; the
        statements that settle jobs and messages count in theirs."""
        ...

    def counter_list(self) -> dict[str, int]:
        """Every durable counter, summed over its shards (absent: never counted)."""
        ...

    def counter_compact(self) -> int:
        """Fold the counter shards of connections that are gone into one; the number of rows
        folded (SQLite keeps one shard: 0). The totals do not change."""
        ...

    def job_next_due(self, tasks: Sequence[str], queues: Sequence[str]) -> DueTime: ...
    def job_limited_waiting(
        self, tasks: Sequence[str], cap: int, partitions: int
    ) -> list[LimitedPartition]:
        """Per partition of these limited tasks with jobs ready or leased (the first
        `partitions` with ready jobs), what waits and what runs."""
        ...

    def job_prune(self, task: str, older_than: timedelta, limit: int) -> int: ...

    # intents
    def intent_get(self, key: str) -> IntentRow | None: ...
    def intent_count(self) -> int: ...

    # retention (store/pruning.py)
    def prune(self, kind: PruneKind, name: str, older_than: timedelta, limit: int) -> int:
        """One batch of at most `limit` rows of `kind` (of task, channel or schedule `name`;
        '' for delivery attempts and the audit) past `older_than`, pruned and counted, oldest
        first."""
        ...

    def prunable(
        self, kind: PruneKind, name: str, older_than: timedelta | None, limit: int
    ) -> Held:
        """What retention holds of `kind` for `name`; `older_than` None: kept for ever."""
        ...

    def prune_names(self, kind: PruneKind) -> list[str]:
        """The names that have rows of `kind` retention may act on ([''] for unnamed kinds)."""
        ...

    # audit
    def audit_list(self, target_id: int | None = None, limit: int = 100) -> list[AuditRow]: ...
    def audit_search(self, where: AuditFilter) -> list[AuditRow]: ...
    def audit_append(self, entry: AuditEntry) -> int:
        """Write `entry` at the store's time, in a transaction of its own; its id."""
        ...

    # outbox
    def outbox_lease(self, params: OutboxLeaseParams) -> list[OutboxLeased]: ...
    def outbox_next_due(self, channels: Sequence[str]) -> DueTime: ...
    def outbox_mark_sending(self, outbox_id: int, token: str) -> bool:
        """The durable marker written right before a non-idempotent send; False if the lease
        was superseded."""
        ...

    def outbox_finish(self, token: str, finishes: Sequence[OutboxFinish]) -> set[int]:
        """Settle rows leased under `token`, fenced; record delivery attempts; return ids."""
        ...

    def outbox_rescue_expired(
        self, channels: Sequence[str], limit: int, decide: RescueDecision
    ) -> list[OutboxFinish]:
        """Lock rows whose lease expired, let `decide` settle them (fenced on their own
        tokens), in one transaction; returns what was applied."""
        ...

    def outbox_resolve(
        self,
        action: OperatorAction,
        resolution: Literal["sent", "resend"],
        receipt: str | None,
        seen: SeenHold | None = None,
    ) -> ActionResult | None:
        """A held row `sent` or pending again, audited; None unless it is still held — and,
        with `seen` (the resolver's), still the hold it judged with no provider event naming
        it."""
        ...

    def outbox_replay(self, action: OperatorAction) -> ActionResult | None: ...
    def outbox_report_duplicate(self, action: OperatorAction) -> ActionResult | None:
        """A recipient reports a sent message arrived twice: audited, and counted
        (`duplicates_reported`) in the same transaction; None unless the row is sent."""
        ...

    def outbox_discard(self, action: OperatorAction, key: str) -> DiscardResult | None:
        """Discard dead message `action.job_id` (whose key is `key`): see `DiscardResult`."""
        ...

    def outbox_get(self, outbox_id: int) -> OutboxRow | None: ...
    def outbox_find_by_key(self, key: str) -> list[OutboxRow]:
        """Rows whose key, or whose intent's key, is `key`."""
        ...

    def outbox_ambiguous_list(
        self, channels: Sequence[str], limit: int, after: int = 0
    ) -> list[OutboxRow]:
        """Held messages of `channels` with ids above `after`, by id, each with when it was
        held (`last_attempt_at`, recorded by delivery attempt `last_attempt_id`) and how many
        provider events named it (`events`)."""
        ...

    # what providers report (deliveries/)
    def provider_event_record(self, event: ProviderEvent) -> ProviderEventRecorded:
        """Record one verified provider event in one transaction: the event (deduplicated on
        its channel and id), its outbox row's event count and furthest stage, the held row it
        settles (audited as `provider`), and the counters."""
        ...

    def outbox_settle_reported(self, held: ReportedHold) -> bool:
        """Settle one held message `sent` on the event that says its provider took it, audited
        and counted in one transaction; False when it is no longer held."""
        ...

    def outbox_reported_list(
        self,
        channels: Sequence[str],
        accepted: Sequence[str],
        holding: Sequence[str],
        limit: int,
        after: int = 0,
    ) -> list[ReportedHold]:
        """Held messages an event of a kind in `accepted` says the provider took, unless their
        furthest stage is one of `holding`."""
        ...

    def provider_event_list(self, outbox_id: int) -> list[ProviderEventRow]: ...
    def outbox_count_by_state(self) -> StateCounts: ...
    def delivery_attempt_list(self, outbox_id: int) -> list[DeliveryAttemptRow]: ...

    # rate limits and channel pauses
    def rate_bucket_configure(self, channel: str, specs: Sequence[BucketSpec]) -> None: ...
    def rate_bucket_apply(self, channel: str, names: Sequence[str], decide: BucketDecision[T]) -> T:
        """Lock the channel's buckets, read its pause, let `decide` compute, write back."""
        ...

    def channel_pause(self, channel: str, pause_for: timedelta, reason: str) -> datetime:
        """Pause a channel for every dispatcher (never shortens a longer pause)."""
        ...

    # schedules
    def schedule_state(self, name: str, grace: timedelta) -> ScheduleState:
        """The schedule's state, created on first sight as if it last fired `grace` ago."""
        ...

    def schedule_state_advance(self, name: str, at: datetime) -> None: ...
    def schedule_state_pause(self, name: str, paused: bool, audit: Audit | None = None) -> None: ...
    def schedule_state_list(self) -> list[tuple[str, bool, datetime | None]]: ...
    def schedule_run_claim(self, claim: ScheduleRunClaim) -> bool: ...
    def schedule_run_extend(
        self, schedule: str, period: str, owner: str, lease_for: timedelta, enqueued: int
    ) -> bool: ...
    def schedule_run_finish(
        self, schedule: str, period: str, owner: str, eligible: int, enqueued: int
    ) -> bool: ...
    def schedule_run_renew(self, schedule: str, period: str, owner: str) -> bool:
        """An owner's sign of life while it fans out (False: its run was taken over or is
        done)."""
        ...

    def schedule_run_take_over(self, take: ScheduleRunTakeOver) -> int | None:
        """Take a gone owner's running fan-out, audited; the audit row's id, or None when the
        run is no longer as it was read (nothing written)."""
        ...

    def schedule_run_busy(self, schedule: str, period: str) -> str | None: ...
    def schedule_run_get(self, schedule: str, period: str) -> ScheduleRunRow | None: ...
    def schedule_run_running(self) -> list[ScheduleRunRow]:
        """Every fan-out running now, of every schedule."""
        ...

    def schedule_run_list(self, schedule: str, limit: int = 50) -> list[ScheduleRunRow]: ...
    def schedule_run_stalled(self, schedule: str) -> list[ScheduleRunRow]:
        """Runs interrupted half-way: `running`, with their owner's lease run out."""
        ...

    # status and listings
    def status_times(self) -> StatusTimes: ...
    def backlog_list(self) -> list[BacklogRow]: ...
    def job_list(self, where: JobFilter) -> list[JobRow]: ...
    def outbox_list(self, where: OutboxFilter) -> list[OutboxRow]: ...
    def schedule_slo_set(self, name: str, window: timedelta | None, target: float | None) -> None:
        """Record the SLO a schedule's code declares (None: none); nothing is written when the
        row already says so. The schedule's row must exist (`schedule_state`)."""
        ...

    def schedule_period_pace(self, schedule: str, period: str) -> PeriodPace:
        """How fast the period's jobs were completed (`oncebox plan`'s measured throughput)."""
        ...

    def schedule_slo_list(self) -> dict[str, tuple[timedelta, float]]:
        """The recorded SLOs: schedule name -> (delivery window, target)."""
        ...

    def schedule_period_stats(
        self, schedule: str, limit: int = 5, window: timedelta | None = None
    ) -> list[PeriodStats]:
        """The latest `limit` periods; with `window` (an SLO's), how many were on time."""
        ...

    # the key-drift guard
    def key_canary_list(self) -> list[KeyCanary]: ...
    def key_canary_get(self, kind: str, name: str) -> KeyCanary | None: ...
    def key_canary_record(self, canary: KeyCanary) -> KeyCanary:
        """Record `canary` unless one is recorded for its task or schedule; return the stored."""
        ...

    def key_canary_accept(self, canary: KeyCanary, actor: str, reason: str) -> int:
        """Replace the recorded canary with `canary`, audited; returns the audit id."""
        ...

    # settings
    def setting_get(self, name: str) -> str | None: ...
    def setting_put_if_absent(self, name: str, value: str) -> str:
        """Store `value` unless a value exists; return the value in effect."""
        ...

    # the HTTP API (api/)
    def api_key_insert(
        self, name: str, scopes: str, secret_sha256: str, rate: str, created_by: str
    ) -> ApiKeyRow | None:
        """A new key; None when the name is taken (a revoked key keeps its name)."""
        ...

    def api_key_get(self, key_id: int) -> ApiKeyRow | None: ...
    def api_key_list(self) -> list[ApiKeyRow]: ...
    def api_key_revoke(self, name: str) -> ApiKeyRow | None:
        """Revoke the named key (again: no change); None when no key has the name."""
        ...

    def api_request_claim(self, claim: ApiRequestClaim) -> ApiRequestRow | None:
        """Hold the key for this request; None when another holds it, answered it, or used it
        with another body (`api_request_get` says which)."""
        ...

    def api_request_get(self, api_key_id: int, idempotency_key: str) -> ApiRequestRow | None:
        """The key's record, unless expired."""
        ...

    def api_request_finish(
        self, api_key_id: int, idempotency_key: str, claim: str, status: int, response: str
    ) -> bool:
        """Record the first answer; False when `claim` no longer holds the key."""
        ...

    def api_request_renew(
        self, api_key_id: int, idempotency_key: str, claim: str, hold: timedelta
    ) -> bool:
        """`claim`, still at work, holds the key `hold` from now; False when it no longer holds
        it (taken over, or answered)."""
        ...

    def api_request_release(self, api_key_id: int, idempotency_key: str, claim: str) -> bool:
        """Forget an in-flight record `claim` holds (its request failed), so a retry runs."""
        ...

    def api_request_prune(self, limit: int) -> int:
        """Delete up to `limit` expired records; how many."""
        ...

    # lanes
    # workers
    def worker_beat(self, beat: WorkerBeat) -> None:
        """Announce or refresh a live worker; forgets workers not seen for a day."""
        ...

    def worker_stop(self, name: str) -> None: ...
    def worker_list(self, live_within: timedelta) -> list[WorkerRow]:
        """Every known worker; `live` when seen within `live_within` and not stopped."""
        ...

    def consumer_session(self, settings: ConsumerSettings) -> ConsumerSession: ...
    def wait_for_work(self, timeout: float) -> frozenset[WorkKind]:
        """Block until work may have arrived — the kinds it may be (PostgreSQL: a job or an
        outbox row, by the NOTIFY's channel; SQLite: any commit, so every kind) — or `timeout`
        seconds pass (empty)."""
        ...

    def notify_work(self, kind: WorkKind) -> None:
        """Wake idle workers' lanes of `kind` after rows became ready without an insert."""
        ...

    def check_identity(self) -> None:
        """Raise `StoreReplaced` when the database this store opened is no longer the one its
        URL names (a SQLite file moved or deleted under it); a server is always itself."""
        ...


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


class ClaimLockTimeout(Exception):
    """Internal: a claim waited `lock_timeout` on a key another live transaction holds (or was
    chosen as a deadlock victim); the consumer retries its batch one job per transaction."""


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
