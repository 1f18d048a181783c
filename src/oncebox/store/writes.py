"""The write operations both stores share: single statements whose parameters differ only in how
time and sets are encoded, and the operations that read, let Python decide, and write back in one
transaction (rate buckets, the outbox lease rescue, a bulk insert that extends its schedule run,
migrations).

A store supplies, besides the read hooks of `store/reads.py`:

- `_apply(name, params, connection=None)`: one statement that writes, in a transaction of its own
  (or in the caller's, on `connection`), and its rows;
- `_transaction()`: a write transaction whose statements see one clock — SQLite's
  `BEGIN IMMEDIATE`, with the clock read once under the lock and bound as `:now`; PostgreSQL's
  pooled connection in a transaction, whose statements lock the rows they decide on
  (`FOR UPDATE`) and read `oncebox_now()` themselves — handing out a `WriteTx`;
- `_at(instant)` and `_span(name, delta)`: how an instant and a duration are sent (microseconds
  on SQLite, in parameters named `<name>_us`; timestamptz and seconds on PostgreSQL, `<name>_s`);
- what truly differs per operation: how a bulk insert's rows are chunked and encoded
  (`_insert_batches`), how buckets are written back (`_bucket_update`), how an outbox
  settlement is written inside a transaction (`_outbox_finish_in`), how a migration takes its
  lock and runs its script (`_migration_transaction`, `_migration_apply`), and how an audited
  operator action is written with its audit row (`_audited`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Generic, Literal, Protocol, TypeVar

from oncebox.kernel import points
from oncebox.kernel.metrics import operation
from oncebox.store.params import (
    Audit,
    AuditEntry,
    InsertRow,
    JobInsert,
    JobInsertMany,
    KeyCanary,
    LimitDeclaration,
    OperatorAction,
    OutboxFinishParams,
    ProviderEvent,
    SeenHold,
    WorkerBeat,
    WorkKind,
)
from oncebox.store.protocol import BucketDecision, F, RescueDecision, T
from oncebox.store.reads import ReadOperations
from oncebox.store.records import (
    ActionResult,
    ApiKeyRow,
    ApiRequestClaim,
    ApiRequestRow,
    BucketState,
    DiscardResult,
    InsertManyResult,
    OutboxRow,
    ProviderEventRecorded,
    ReportedHold,
    ScheduleRunClaim,
    ScheduleRunTakeOver,
    ScheduleState,
)
from oncebox.store.rows import Result
from oncebox.store.sqlfiles import Migration


class WriteTx(Protocol):
    """One write transaction of a store (see `WriteOperations._transaction`)."""

    def fetch(self, name: str, params: dict[str, Any]) -> Result:
        """Run a named statement in the transaction; its rows (none for a statement without)."""
        ...

    def fetch_each(self, name: str, params: Iterable[dict[str, Any]]) -> list[Result]:
        """Run a named statement once per parameter set, in order (PostgreSQL pipelines them:
        the server runs one while the next is still being drawn)."""
        ...

    def now(self) -> datetime:
        """The store's clock, as the transaction's statements see it."""
        ...


Tx = TypeVar("Tx", bound=WriteTx)


class WriteOperations(ReadOperations, Generic[Tx]):
    """See the module docstring; `Tx` is the store's `WriteTx`."""

    # -- hooks ---------------------------------------------------------------------------------

    def _apply(self, name: str, params: dict[str, Any], connection: object | None = None) -> Result:
        raise NotImplementedError

    def _transaction(self) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def _caller_transaction(self, connection: object) -> AbstractContextManager[Tx]:
        """The caller's own transaction on `connection` (see `store/caller.py`)."""
        raise NotImplementedError

    def _at(self, instant: datetime | None) -> Any:
        raise NotImplementedError

    def _insert_batches(self, rows: Iterable[InsertRow]) -> Iterable[tuple[int, Any]]:
        """`rows` in chunks: (rows in the chunk, the chunk as the `rows` parameter)."""
        raise NotImplementedError

    def _bucket_update(self, buckets: Sequence[BucketState]) -> dict[str, Any]:
        raise NotImplementedError

    def _outbox_finish_in(
        self, tx: Tx, token: str, finishes: Sequence[OutboxFinishParams]
    ) -> set[int]:
        raise NotImplementedError

    def _migrations(self) -> list[Migration]:
        raise NotImplementedError

    def _migration_transaction(
        self, connection: object | None = None
    ) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def _migration_apply(self, tx: Tx, migration: Migration) -> None:
        raise NotImplementedError

    def _audited(self, name: str, params: dict[str, Any]) -> ActionResult | None:
        """An operator action (`name`) and its audit row, in one transaction."""
        raise NotImplementedError

    def _audited_in(self, tx: Tx, name: str, params: dict[str, Any]) -> ActionResult | None:
        """The same in the caller's transaction."""
        raise NotImplementedError

    def notify_work(self, kind: WorkKind) -> None:
        raise NotImplementedError

    # -- schema --------------------------------------------------------------------------------

    @operation
    def schema_migrate(self, connection: object | None = None) -> list[int]:
        """Apply the migrations not yet applied; in the caller's transaction on `connection`
        (an Alembic revision's, say: `oncebox/alembic.py`)."""
        applied_now: list[int] = []
        with self._migration_transaction(connection) as tx:
            tx.fetch("migration_table_create", {})
            listed = tx.fetch("migration_list", {})
            version = listed.columns()["version"]
            applied = {row[version] for row in listed.rows}
            for migration in self._migrations():
                if migration.version in applied:
                    continue
                self._migration_apply(tx, migration)
                params = {
                    "version": migration.version,
                    "name": migration.name,
                    "checksum": migration.checksum,
                }
                tx.fetch("migration_record", params)
                applied_now.append(migration.version)
        return applied_now

    # -- enqueue -------------------------------------------------------------------------------

    @operation
    def job_insert(self, job: JobInsert, connection: object | None = None) -> tuple[int, bool]:
        """Write one job, unless its key is taken (or, for a debounced or throttled task, a
        pending job of its debounce key was just made: `job_merge` joins it)."""
        params = self._insert_params(job)
        if job.collapse is not None:
            inserted = self._insert_collapsed(params, connection)
        else:
            inserted = self._insert_job(params, connection)
        return (int(inserted.first("id")), True) if inserted.rows else (0, False)

    @operation
    def job_merge(
        self, job: JobInsert, connection: object | None = None
    ) -> tuple[int, str | None] | None:
        """Join the pending job of the debounce key of `job` (jobs/debounce.py): its id and key
        after the merge, or None when there is none to join."""
        assert job.collapse is not None
        merged = self._merge_job(self._insert_params(job), connection)
        return (int(merged.first("id")), merged.first("key")) if merged.rows else None

    def _insert_params(self, job: JobInsert) -> dict[str, Any]:
        collapse = job.collapse
        return {
            "state": "relayed" if job.relayed else "ready",
            "key": job.key,
            "task": job.task,
            "queue": job.queue,
            "args": job.args_json,
            "priority": job.priority,
            "group_key": job.group_key,
            "limit_key": job.limit_key,
            "max_attempts": job.max_attempts,
            "run_at": self._at(job.run_at),
            **self._span("delay", job.delay),
            **self._span("max_age", job.max_age),
            "trace_context": job.trace_context,
            "debounce_key": None if collapse is None else collapse.key,
            "throttle": collapse is not None and collapse.throttle,
            "keep_last": collapse is not None and collapse.keep_last,
            **self._span("window", None if collapse is None else collapse.window),
            **self._span("max_wait", None if collapse is None else collapse.max_wait),
        }

    def _insert_collapsed(self, params: dict[str, Any], connection: object | None) -> Result:
        """`job_insert_collapsed`, which counts what it did itself (PostgreSQL)."""
        return self._apply("job_insert_collapsed", params, connection)

    def _merge_job(self, params: dict[str, Any], connection: object | None) -> Result:
        """`job_merge`, which counts what it did itself (PostgreSQL)."""
        return self._apply("job_merge", params, connection)

    def _insert_job(self, params: dict[str, Any], connection: object | None) -> Result:
        """`job_insert`, which counts what it did itself (PostgreSQL)."""
        return self._apply("job_insert", params, connection)

    def _count_inserted(self, tx: Tx, offered: int, created: int) -> None:
        """After `job_insert_many`: nothing on PostgreSQL, whose statement counts itself."""

    @operation
    def counter_compact(self) -> int:
        return self._apply("counter_compact", {}).count

    @operation
    def counter_add(self, deltas: Mapping[str, int]) -> None:
        if any(deltas.values()):
            self._apply("counter_add", {"deltas": json.dumps(dict(sorted(deltas.items())))})

    @operation
    def job_insert_many(
        self, jobs: JobInsertMany, connection: object | None = None
    ) -> InsertManyResult:
        run = jobs.for_run
        params = {
            "task": jobs.task,
            "queue": jobs.queue,
            "priority": jobs.priority,
            "max_attempts": jobs.max_attempts,
            "schedule": None if run is None else run.schedule,
            "period": None if run is None else run.period,
            "run_at": self._at(jobs.run_at),
            **self._span("delay", jobs.delay),
            **self._span("max_age", jobs.max_age),
            "trace_context": jobs.trace_context,
            "state": "relayed" if jobs.relayed else "ready",
        }
        offered = 0

        def chunks(batches: Iterable[tuple[int, Any]]) -> Iterator[dict[str, Any]]:
            nonlocal offered
            for count, rows in batches:
                offered += count
                yield {**params, "rows": rows}

        batches = self._insert_batches(jobs.rows)  # SQLite: drawn now, before the write lock
        if connection is not None:
            # every job checked before a row is written: a bad one must not leave the others in
            # a transaction the caller goes on with
            batches = list(batches)
        scope = self._transaction() if connection is None else self._caller_transaction(connection)
        with scope as tx:
            created: list[tuple[int, str | None]] = []
            for inserted in tx.fetch_each("job_insert_many", chunks(batches)):
                id_, key = inserted.columns()["id"], inserted.columns()["key"]
                created += [(int(row[id_]), row[key]) for row in inserted.rows]
            self._count_inserted(tx, offered, len(created))
            held = True
            if run is not None:
                extend = self._run_extend(
                    run.schedule, run.period, run.owner, run.lease_for, len(created)
                )
                held = bool(tx.fetch("schedule_run_extend", extend).rows)
        return InsertManyResult(created, offered, held)

    # -- leases --------------------------------------------------------------------------------

    @operation
    def job_unlimit(self, tasks: Sequence[str], limit: int, declared_within: timedelta) -> int:
        """Ready jobs of `tasks` (none of them limited in the caller's code) that carry a
        partition lose it, up to `limit`: the unlimited lease takes only jobs without one
        (0015). Only a task no process has declared limited within `declared_within`."""
        if not tasks:
            return 0
        params = {"tasks": self._set(tasks), "limit": limit}
        return self._apply("job_unlimit", {**params, **self._span("within", declared_within)}).count

    @operation
    def limit_declare(
        self, declared: Sequence[LimitDeclaration], connection: object | None = None
    ) -> None:
        if declared:
            rows = json.dumps([[d.task, d.limits] for d in declared])
            self._apply("limit_declare", {"declared": rows}, connection)

    @operation
    def job_lease_extend(self, tokens: Sequence[str], lease_for: timedelta) -> int:
        params = {"tokens": self._set(tokens), **self._span("lease", lease_for)}
        return self._apply("job_lease_extend", params).count

    @operation
    def job_relay_adopt(self, queues: Sequence[str], tasks: Sequence[str], limit: int) -> int:
        """Ready jobs of `tasks` in `queues` (queues a broker holds) become relayed — each then
        published by the relay (0016) — up to `limit`."""
        if not queues or not tasks:
            return 0
        params = {"queues": self._set(queues), "tasks": self._set(tasks), "limit": limit}
        return self._apply("job_relay_adopt", params).count

    @operation
    def job_attempt_note(self, job_id: int, attempt: int, worker: str, note: str) -> None:
        params = {"job_id": job_id, "attempt": attempt, "worker": worker, "note": note}
        self._apply("job_attempt_note", params)

    # -- operator actions ----------------------------------------------------------------------

    def _replayed(self, name: str, action: OperatorAction, kind: WorkKind) -> ActionResult | None:
        """A replay: audited, and idle workers' lanes of `kind` woken when it made a row ready."""
        result = self._audited(name, _action_params(action))
        if result is not None:
            self.notify_work(kind)
        return result

    @operation
    def job_replay(self, action: OperatorAction) -> ActionResult | None:
        return self._replayed("job_replay", action, "jobs")

    @operation
    def job_cancel(self, action: OperatorAction) -> ActionResult | None:
        return self._audited("job_cancel", _action_params(action))

    @operation
    def job_discard(self, action: OperatorAction) -> ActionResult | None:
        return self._audited("job_discard", _action_params(action))

    @operation
    def outbox_resolve(
        self,
        action: OperatorAction,
        resolution: Literal["sent", "resend"],
        receipt: str | None,
        seen: SeenHold | None = None,
    ) -> ActionResult | None:
        params = {**_action_params(action), "resolution": resolution, "receipt": receipt}
        params.update(_seen_params(seen))
        result = self._audited("outbox_resolve", params)
        if result is not None and resolution == "resend":
            self.notify_work("outbox")
        return result

    @operation
    def outbox_replay(self, action: OperatorAction) -> ActionResult | None:
        return self._replayed("outbox_replay", action, "outbox")

    @operation
    def outbox_report_duplicate(self, action: OperatorAction) -> ActionResult | None:
        params = _action_params(action)
        with self._transaction() as tx:
            found = tx.fetch("outbox_report_duplicate", params)
            if not found.rows:
                return None
            row = dict(zip(found.columns(), found.rows[0], strict=True))
            audit = tx.fetch("outbox_report_duplicate__audit", {**params, **row})
            tx.fetch("counter_add", {"deltas": json.dumps({"duplicates_reported": 1})})
        return ActionResult(job_id=row["id"], key=row["key"], audit_id=audit.first("id"))

    @operation
    def outbox_discard(self, action: OperatorAction, key: str) -> DiscardResult | None:
        params = {**_action_params(action), "key": key}
        with self._transaction() as tx:
            tx.fetch("outbox_discard__lock", params)
            found = tx.fetch("outbox_discard", params)
            if not found.rows:
                return None
            row = dict(zip(found.columns(), found.rows[0], strict=True))
            intent = {"intent_key": row["intent_key"]}
            kept = tuple((k, s) for k, s in tx.fetch("outbox_discard__kept", intent).rows)
            released, reopened = False, None
            if not kept:  # nothing of the intent stands: free its key, re-open its job
                released = bool(tx.fetch("outbox_discard__release", intent).rows)
                error = f"its message {row['id']} was discarded by {action.actor}: {action.reason}"
                job = tx.fetch("outbox_discard__job", {"job_id": row["job_id"], "error": error})
                reopened = job.first("id") if job.rows else None
            audit = tx.fetch(
                "outbox_discard__audit",
                {
                    **params,
                    "channel": row["channel"],
                    "renamed": row["key"],
                    "released": released,
                    "job_reopened": reopened,
                },
            )
            return DiscardResult(
                id=row["id"],
                key=key,
                renamed=row["key"],
                intent_key=row["intent_key"],
                kept=kept,
                intent_released=released,
                job_reopened=reopened,
                audit_id=audit.first("id"),
            )

    # -- the outbox ----------------------------------------------------------------------------

    @operation
    def outbox_mark_sending(self, outbox_id: int, token: str) -> bool:
        return bool(self._apply("outbox_mark_sending", {"id": outbox_id, "token": token}).rows)

    @operation
    def outbox_rescue_expired(
        self, channels: Sequence[str], limit: int, decide: RescueDecision[F]
    ) -> list[F]:
        applied: list[F] = []
        with self._transaction() as tx:
            now = tx.now()
            params = {"limit": limit, "channels": self._set(channels)}
            rows = tx.fetch("outbox_rescue_select", params).records(OutboxRow, self._instant)
            tokens = {row.id: row.lease_token for row in rows}
            for finish in decide(rows, now):
                token = tokens.get(finish.id)
                if token is not None and self._outbox_finish_in(tx, token, [finish]):
                    applied.append(finish)
        return applied

    # -- what providers report (deliveries/) --------------------------------------------------

    @operation
    def provider_event_record(self, event: ProviderEvent) -> ProviderEventRecorded:
        params = {
            "channel": event.channel,
            "event_id": event.event_id,
            "kind": event.kind,
            "token": event.token,
            "provider_id": event.provider_id,
            "occurred_at": self._at(event.occurred_at),
        }
        with self._transaction() as tx:
            inserted = tx.fetch("provider_event_insert", params)
            if not inserted.rows:
                tx.fetch("counter_add", {"deltas": json.dumps({"provider_events_duplicate": 1})})
                return ProviderEventRecorded("duplicate")
            outbox_id = inserted.first("outbox_id")
            if outbox_id is None:
                tx.fetch("counter_add", {"deltas": json.dumps({"provider_events_unmatched": 1})})
                return ProviderEventRecorded("unmatched")
            found = tx.fetch("outbox_report_lock", {"id": outbox_id})
            row = dict(zip(found.columns(), found.rows[0], strict=True))
            was = row["reported"]
            advanced = event.stage is not None and (was is None or was in event.below)
            deltas = {"provider_events": 1}
            # counted on the row whether or not it moves the stage — the resolver's fence — but
            # for a sent row (opens, clicks), which no one judges again, only when it moves
            if advanced or row["state"] != "sent":
                stage_now = event.stage if advanced else None
                tx.fetch("outbox_report", {"id": outbox_id, "stage": stage_now})
            if advanced:
                deltas[f"reports:{event.channel}:{event.stage}"] = 1
                if was is None:
                    deltas[f"reports:{event.channel}:reported"] = 1
            stage = event.stage if advanced else was
            settled = False
            if event.settles and row["state"] == "ambiguous" and stage not in event.holding:
                settled = self._settle_in(tx, int(outbox_id), event.reason, event.provider_id)
                deltas["sends_settled_by_provider"] = int(settled)
            tx.fetch("counter_add", {"deltas": json.dumps(deltas)})
            points.reach("provider_event.recorded")
        return ProviderEventRecorded(
            "recorded", int(outbox_id), str(row["state"]), advanced, settled
        )

    @operation
    def outbox_settle_reported(self, held: ReportedHold) -> bool:
        reason = f"the provider reported it {held.kind} (event {held.event_id})"
        with self._transaction() as tx:
            settled = self._settle_in(tx, held.id, reason, held.provider_id)
            if settled:
                tx.fetch("counter_add", {"deltas": json.dumps({"sends_settled_by_provider": 1})})
        return settled

    def _settle_in(self, tx: Tx, outbox_id: int, reason: str, receipt: str | None) -> bool:
        """A held message `sent` on its provider's word, audited as `provider`, in `tx`;
        fenced on the row still being held."""
        action = OperatorAction(outbox_id, PROVIDER_ACTOR, reason)
        params = {**_action_params(action), "resolution": "sent", "receipt": receipt}
        params.update(_seen_params(None))  # driven by an event: no "no event" fence
        return self._audited_in(tx, "outbox_resolve", params) is not None

    # -- rate limits and channel pauses --------------------------------------------------------

    @operation
    def rate_bucket_apply(self, channel: str, names: Sequence[str], decide: BucketDecision[T]) -> T:
        params = {"channel": channel, "names": self._set(names)}
        if not names:  # no buckets to lock and update: the pause alone, one statement
            paused = self._fetch("channel_pause_read", params)
            return decide([], self._required_instant(paused.first("now")), self._paused(paused))[1]
        with self._transaction() as tx:
            found = tx.fetch("rate_bucket_select", params)  # locks the buckets
            buckets = found.records(BucketState, self._instant)
            if not buckets:
                found = tx.fetch("channel_pause_read", params)
            now = self._required_instant(found.first("now"))
            after, result = decide(buckets, now, self._paused(found))
            if after:
                tx.fetch("rate_bucket_update", {"channel": channel, **self._bucket_update(after)})
        return result

    def _paused(self, found: Result) -> datetime | None:
        return self._instant(found.first("paused_until"))

    @operation
    def channel_pause(self, channel: str, pause_for: timedelta, reason: str) -> datetime:
        params = {"channel": channel, **self._span("pause", pause_for), "reason": reason}
        return self._required_instant(self._apply("channel_pause", params).first("paused_until"))

    @operation
    def setting_put_if_absent(self, name: str, value: str) -> str:
        self._apply("setting_put_if_absent", {"name": name, "value": value})
        stored = self.setting_get(name)
        assert stored is not None  # put unless present: present either way
        return stored

    # -- the HTTP API --------------------------------------------------------------------------

    @operation
    def api_key_insert(
        self, name: str, scopes: str, secret_sha256: str, rate: str, created_by: str
    ) -> ApiKeyRow | None:
        params = {
            "name": name,
            "scopes": scopes,
            "secret_sha256": secret_sha256,
            "rate": rate,
            "created_by": created_by,
        }
        return self._apply("api_key_insert", params).record(ApiKeyRow, self._instant)

    @operation
    def api_key_revoke(self, name: str) -> ApiKeyRow | None:
        return self._apply("api_key_revoke", {"name": name}).record(ApiKeyRow, self._instant)

    @operation
    def api_request_claim(self, claim: ApiRequestClaim) -> ApiRequestRow | None:
        params = {
            "api_key_id": claim.api_key_id,
            "idempotency_key": claim.idempotency_key,
            "fingerprint": claim.fingerprint,
            "claim": claim.claim,
            **self._span("retain", claim.retain),
            **self._span("hold", claim.hold),
        }
        return self._apply("api_request_claim", params).record(ApiRequestRow, self._instant)

    @operation
    def api_request_finish(
        self, api_key_id: int, idempotency_key: str, claim: str, status: int, response: str
    ) -> bool:
        params = {
            "api_key_id": api_key_id,
            "idempotency_key": idempotency_key,
            "claim": claim,
            "status": status,
            "response": response,
        }
        return bool(self._apply("api_request_finish", params).rows)

    @operation
    def api_request_renew(
        self, api_key_id: int, idempotency_key: str, claim: str, hold: timedelta
    ) -> bool:
        params = {
            "api_key_id": api_key_id,
            "idempotency_key": idempotency_key,
            "claim": claim,
            **self._span("hold", hold),
        }
        return bool(self._apply("api_request_renew", params).rows)

    @operation
    def api_request_release(self, api_key_id: int, idempotency_key: str, claim: str) -> bool:
        params = {"api_key_id": api_key_id, "idempotency_key": idempotency_key, "claim": claim}
        return bool(self._apply("api_request_release", params).rows)

    @operation
    def api_request_prune(self, limit: int) -> int:
        return len(self._apply("api_request_prune", {"limit": limit}).rows)

    # -- the audit log -------------------------------------------------------------------------

    @operation
    def audit_append(self, entry: AuditEntry) -> int:
        params = {
            "actor": entry.actor,
            "action": entry.action,
            "target_kind": entry.target_kind,
            "target_key": entry.target_key,
            "reason": entry.reason,
            "details": entry.details,
        }
        return int(self._apply("audit_append", params).first("id"))

    # -- the key-drift guard -------------------------------------------------------------------

    @operation
    def key_canary_record(self, canary: KeyCanary) -> KeyCanary:
        self._apply("key_canary_record", canary_params(canary))
        stored = self.key_canary_get(canary.kind, canary.name)
        assert stored is not None
        return stored

    # -- schedules -----------------------------------------------------------------------------

    @operation
    def schedule_state(self, name: str, grace: timedelta) -> ScheduleState:
        state = self._record(ScheduleState, "schedule_state_get", {"name": name})
        if state is None:
            self._apply("schedule_state_init", {"name": name, **self._span("grace", grace)})
            state = self._record(ScheduleState, "schedule_state_get", {"name": name})
        assert state is not None  # created unless present: present either way
        return state

    @operation
    def schedule_slo_set(self, name: str, window: timedelta | None, target: float | None) -> None:
        seconds = None if window is None else window.total_seconds()
        self._apply("schedule_slo_set", {"name": name, "window_s": seconds, "target": target})

    @operation
    def schedule_state_advance(self, name: str, at: datetime) -> None:
        self._apply("schedule_state_advance", {"name": name, "at": self._at(at)})

    @operation
    def schedule_state_pause(self, name: str, paused: bool, audit: Audit | None = None) -> None:
        params = {"name": name, "paused": paused}
        with self._transaction() as tx:
            tx.fetch("schedule_state_pause", params)
            if audit is not None:
                audited = {**params, "actor": audit.actor, "reason": audit.reason}
                tx.fetch("schedule_state_pause__audit", audited)

    @operation
    def schedule_run_claim(self, claim: ScheduleRunClaim) -> bool:
        params = {
            "schedule": claim.schedule,
            "period": claim.period,
            "fire_at": self._at(claim.fire_at),
            "owner": claim.owner,
            **self._span("lease", claim.lease_for),
            "late": claim.late,
            "rescan": claim.rescan,
        }
        return bool(self._apply("schedule_run_claim", params).rows)

    @operation
    def schedule_run_extend(
        self, schedule: str, period: str, owner: str, lease_for: timedelta, enqueued: int
    ) -> bool:
        params = self._run_extend(schedule, period, owner, lease_for, enqueued)
        return bool(self._apply("schedule_run_extend", params).rows)

    def _run_extend(
        self, schedule: str, period: str, owner: str, lease_for: timedelta, enqueued: int
    ) -> dict[str, Any]:
        return {
            "schedule": schedule,
            "period": period,
            "owner": owner,
            **self._span("lease", lease_for),
            "enqueued": enqueued,
        }

    @operation
    def schedule_run_renew(self, schedule: str, period: str, owner: str) -> bool:
        params = {"schedule": schedule, "period": period, "owner": owner}
        return bool(self._apply("schedule_run_renew", params).rows)

    def _take_over(self, take: ScheduleRunTakeOver) -> dict[str, Any]:
        """The take-over's parameters: the run as it was read (`seen_*`, also as text for the
        audit row's details), the new owner and lease, who and why."""
        seen_renewed = take.seen_renewed_at
        return {
            "schedule": take.schedule,
            "period": take.period,
            "owner": take.owner,
            **self._span("lease", take.lease_for),
            "seen_owner": take.seen_owner,
            "seen_lease": self._at(take.seen_lease_expires_at),
            "seen_renewed": self._at(seen_renewed),
            "seen_lease_text": take.seen_lease_expires_at.isoformat(),
            "seen_renewed_text": None if seen_renewed is None else seen_renewed.isoformat(),
            "actor": take.actor,
            "reason": take.reason,
        }

    @operation
    def schedule_run_finish(
        self, schedule: str, period: str, owner: str, eligible: int, enqueued: int
    ) -> bool:
        params = {
            "schedule": schedule,
            "period": period,
            "owner": owner,
            "eligible": eligible,
            "enqueued": enqueued,
        }
        return bool(self._apply("schedule_run_finish", params).rows)

    # -- workers -------------------------------------------------------------------------------

    @operation
    def worker_stop(self, name: str) -> None:
        self._apply("worker_stop", {"name": name})


def beat_params(beat: WorkerBeat) -> dict[str, Any]:
    return {
        "name": beat.name,
        "host": beat.host,
        "pid": beat.pid,
        "tasks": json.dumps(list(beat.tasks)),
        "queues": json.dumps(list(beat.queues)),
        "channels": json.dumps(list(beat.channels)),
    }


PROVIDER_ACTOR = "provider"  # who the audit says settled a held send on a provider's report


def _action_params(action: OperatorAction) -> dict[str, Any]:
    return {
        "id": action.job_id,
        "actor": action.actor,
        "reason": action.reason,
        "if_attempt": action.if_attempt,
    }


def _seen_params(seen: SeenHold | None) -> dict[str, Any]:
    """`outbox_resolve`'s fence on the hold the resolver judged (None: an operator's or the
    provider's settlement, fenced on the row being held only)."""
    return {
        "seen_attempt": None if seen is None else seen.attempt,
        "seen_held_by": None if seen is None else seen.held_by,
    }


def canary_params(canary: KeyCanary) -> dict[str, Any]:
    return {
        "kind": canary.kind,
        "name": canary.name,
        "source": canary.source,
        "outputs": json.dumps(list(canary.outputs)),
    }
