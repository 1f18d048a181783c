"""The `Store` protocol: every database operation oncebox performs, by name.

Internal: this interface may change between releases. Each operation is named noun + verb and
takes a small frozen dataclass of parameters (`params.py`) and returns rows (`records.py`): the
seam in three parts, so a newcomer finds an operation here, what it takes there, what it hands
up in the third. Time is never a parameter: every operation reads
the store's own clock (`oncebox_now()`), so all processes share one notion of time. Two
implementations exist, `store/sqlite.py` and `store/postgres.py`; one conformance suite
(`tests/store_contract/`) runs against both.

Connections: a `Store` hands out short-lived connections per operation. The consumer lane gets a
`ConsumerSession` instead — one dedicated connection that leases jobs and runs the consumer
transaction, in which the handler runs on the same connection as the claim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

from oncebox.kernel.clock import ClockSetting
from oncebox.store.params import (
    Audit,
    AuditEntry,
    AuditFilter,
    BucketSpec,
    ConsumerSettings,
    IntentClaim,
    JobFilter,
    JobFinish,
    JobInsert,
    JobInsertMany,
    JobLeaseParams,
    JobReleaseParams,
    KeyCanary,
    LimitDeclaration,
    OperatorAction,
    OutboxFilter,
    OutboxFinishParams,
    OutboxInsert,
    OutboxLeaseParams,
    ProviderEvent,
    PruneKind,
    RelayedFinish,
    SeenHold,
    WorkerBeat,
    WorkKind,
)
from oncebox.store.records import (
    ActionResult,
    ApiKeyRow,
    ApiRequestClaim,
    ApiRequestRow,
    AttemptRow,
    AuditRow,
    BacklogRow,
    BucketState,
    DeliveryAttemptRow,
    DiscardResult,
    DueTime,
    EnqueueConflict,
    Held,
    HistoryTended,
    InsertManyResult,
    IntentRow,
    JobRow,
    LeasedJob,
    LimitedPartition,
    OutboxLeased,
    OutboxRow,
    PeriodPace,
    PeriodStats,
    ProviderEventRecorded,
    ProviderEventRow,
    RelayedRow,
    ReportedHold,
    RescuedJob,
    ScheduleRunClaim,
    ScheduleRunRow,
    ScheduleRunTakeOver,
    ScheduleState,
    SchemaStatus,
    StateCounts,
    StatusTimes,
    WorkerRow,
)

T = TypeVar("T")
RELAY_NEEDS_POSTGRES = (
    "a queue a broker holds keeps its jobs' records on PostgreSQL: on SQLite, publish to it "
    "with box.publish_unrecorded, or leave the queue to the table"
)


# What the lanes decide between a store's read and its write, in the store's transaction: the
# outbox rescue settles rows whose lease expired (given the rows and the time); the rate limiter
# takes tokens (given the channel's buckets, the time and the channel's pause; returning the
# buckets to write back and its verdict).
F = TypeVar("F", bound=OutboxFinishParams)  # the outbox's own finish type, as its lane built it
RescueDecision = Callable[[list[OutboxRow], datetime], list[F]]


BucketDecision = Callable[
    [list[BucketState], datetime, datetime | None], tuple[list[BucketState], T]
]


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

    #: Whether finished jobs leave the jobs table for a history (PostgreSQL, migration 0025):
    #: only then has `job_history_tend` anything to do (the pruner asks it on every pass).
    keeps_history: bool

    def job_history_drop(
        self, keep: Mapping[str, timedelta | None], default: timedelta | None
    ) -> int:
        """The oldest week of the history dropped whole, once it ended, every task with jobs in
        it is past its retention (`keep` per task, None: for ever; `default` for a task not in
        it) and none of its jobs has a message still to send — what its jobs counted folded
        first, as `job_prune` folds a batch's. The jobs dropped (0: none). PostgreSQL only."""
        ...

    def job_history_tend(self, ahead: timedelta, limit: int) -> HistoryTended:
        """The history of finished jobs kept ready (PostgreSQL, migration 0025): its weeks
        made up to `ahead` (and back to the first finished job still to move), and one batch of
        at most `limit` finished jobs from before the history moved into it. SQLite keeps its
        finished jobs in its jobs table: nothing to do."""
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

    def outbox_finish(self, token: str, finishes: Sequence[OutboxFinishParams]) -> set[int]:
        """Settle rows leased under `token`, fenced; record delivery attempts; return ids."""
        ...

    def outbox_rescue_expired(
        self, channels: Sequence[str], limit: int, decide: RescueDecision[F]
    ) -> list[F]:
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


class ClaimLockTimeout(Exception):
    """Internal: a claim waited `lock_timeout` on a key another live transaction holds (or was
    chosen as a deadlock victim); the consumer retries its batch one job per transaction."""
