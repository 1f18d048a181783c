"""Rows handed up: what the store's operations return, each a small frozen dataclass, and the
states a row can be in. `params.py` holds what operations take, `protocol.py` the operations."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

JobState = Literal["ready", "leased", "relayed", "done", "dead", "cancelled"]


FinishState = Literal["done", "ready", "dead"]


Outcome = Literal["completed", "duplicate"]
ACTIVE_STATES: tuple[JobState, ...] = ("ready", "leased", "relayed", "dead")


@dataclass(frozen=True, slots=True)
class InsertManyResult:
    created: list[tuple[int, str | None]]
    offered: int  # rows drawn from `JobInsertMany.rows`
    run_held: bool = True  # False: `for_run` was taken over by another scheduler


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


OutboxState = Literal["pending", "leased", "sending", "sent", "dead", "ambiguous", "discarded"]


OutboxFinishState = Literal["sent", "pending", "dead", "ambiguous"]


DeliveryOutcome = Literal[
    "sent", "failed", "throttled", "dead", "ambiguous", "resent", "lease_expired"
]


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


@dataclass(frozen=True, slots=True)
class Held:
    """What retention holds of one kind of row for one name (task, channel, schedule, or ''):
    when the oldest row it still keeps happened, and how many rows are past their retention
    (counted up to a limit) — waiting for the pruner."""

    oldest: datetime | None
    waiting: int


#: finished jobs still to move into the history are counted up to this many (`job_history_tend`)
HISTORY_WAITING_CAP = 10_000


@dataclass(frozen=True, slots=True)
class HistoryTended:
    """What one pass of `Store.job_history_tend` did: weekly partitions made (None: their
    lock was busy, the next pass tries again), finished jobs moved into the history, and how
    many were still to move before it (counted up to a limit)."""

    made: int | None
    moved: int
    waiting: int


@dataclass(frozen=True, slots=True)
class LimitedPartition:
    """One partition of a limited task (jobs/limits.py): its due jobs waiting (counted up to a
    cap), the earliest due time among those counted, and its jobs leased now."""

    task: str
    partition: str  # '' for a task limited as a whole
    waiting: int
    oldest: datetime | None
    leased: int
