"""The read operations both stores share: the same named queries, read into the same records.

A store supplies `_fetch(name, params)` (run a named query: its rows, and its column names when
asked), `_instant(value)` (its stored instant as an aware UTC datetime: microseconds on SQLite,
timestamptz on PostgreSQL) and `_set(values)` (a list parameter: a JSON array on SQLite, an
array on PostgreSQL); everything else about reading jobs, attempts, intents, the outbox and the
audit log is here once. Rows are read by column name (`store/rows.py`): the statements' aliases
are the records' field names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any, TypeVar

from oncebox.kernel.metrics import Metrics, operation
from oncebox.store.params import AuditFilter, JobFilter, KeyCanary, LimitDeclaration, OutboxFilter
from oncebox.store.records import (
    ApiKeyRow,
    ApiRequestRow,
    AttemptRow,
    AuditRow,
    BacklogRow,
    DeliveryAttemptRow,
    DueTime,
    EnqueueConflict,
    IntentRow,
    JobRow,
    LeasedJob,
    LimitedPartition,
    OutboxLeased,
    OutboxRow,
    PeriodPace,
    PeriodStats,
    ProviderEventRow,
    RelayedRow,
    ReportedHold,
    ScheduleRunRow,
    StateCounts,
    StatusTimes,
    WorkerRow,
)
from oncebox.store.rows import Result

R = TypeVar("R")


class ReadOperations:
    metrics: Metrics

    def _fetch(self, name: str, params: dict[str, Any], connection: object | None = None) -> Result:
        """Run a named query (on the caller's `connection`, if given)."""
        raise NotImplementedError

    def _instant(self, value: Any) -> datetime | None:
        raise NotImplementedError

    def _set(self, values: Sequence[Any]) -> Any:
        raise NotImplementedError

    def _span(self, name: str, delta: timedelta | None) -> dict[str, Any]:
        """A duration parameter: `<name>_us` microseconds on SQLite, `<name>_s` seconds on
        PostgreSQL."""
        raise NotImplementedError

    def _required_instant(self, value: Any) -> datetime:
        instant = self._instant(value)
        assert instant is not None
        return instant

    def _records(self, cls: type[R], name: str, params: dict[str, Any]) -> list[R]:
        return self._fetch(name, params).records(cls, self._instant)

    def _record(
        self, cls: type[R], name: str, params: dict[str, Any], connection: object | None = None
    ) -> R | None:
        return self._fetch(name, params, connection).record(cls, self._instant)

    def _leased_jobs(self, result: Result) -> list[LeasedJob]:
        """Rows of `job_lease`, in claim order (RETURNING gives no order)."""
        leased = result.records(LeasedJob, self._instant)
        leased.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return leased

    def _leased_outbox(self, result: Result, token: str) -> list[OutboxLeased]:
        """Rows of `outbox_lease`, in id order."""
        leased = result.records(OutboxLeased, self._instant, {"lease_token": token})
        leased.sort(key=lambda row: row.id)
        return leased

    @operation
    def job_get(self, job_id: int) -> JobRow | None:
        return self._record(JobRow, "job_get", {"id": job_id})

    @operation
    def job_find_by_key(self, key: str) -> list[JobRow]:
        return self._records(JobRow, "job_find_by_key", {"key": key})

    @operation
    def job_relay_check(self, ids: Sequence[int]) -> dict[int, RelayedRow]:
        if not ids:
            return {}
        rows = self._records(RelayedRow, "job_relay_check", {"ids": self._set(ids)})
        return {row.id: row for row in rows}

    @operation
    def job_attempt_list(self, job_id: int) -> list[AttemptRow]:
        return self._records(AttemptRow, "job_attempt_list", {"id": job_id})

    @operation
    def counter_list(self) -> dict[str, int]:
        result = self._fetch("counter_list", {})
        name, value = result.columns()["name"], result.columns()["value"]
        return {row[name]: int(row[value]) for row in result.rows}

    @operation
    def job_next_due(self, tasks: Sequence[str], queues: Sequence[str]) -> DueTime:
        """One statement, outside any transaction: an idle lane's poll asks it before it leases
        (`Worker._poll`). Each task's first entry of oncebox_jobs_task_due is the only plan in
        that order, so no statistics can turn it into a sort of the backlog."""
        due = self._record(
            DueTime, "job_next_due", {"tasks": self._set(tasks), "queues": self._set(queues)}
        )
        assert due is not None  # one row, always
        return due

    @operation
    def job_limited_waiting(
        self, tasks: Sequence[str], cap: int, partitions: int
    ) -> list[LimitedPartition]:
        """Two reads, each bounded: the skip scan of the partitions with their first `cap` due
        jobs, and the leased jobs (as many as the limits let run)."""
        params = {"tasks": self._set(tasks), "counted": self._set(tasks)}
        waiting = self._fetch(
            "job_limited_waiting", {**params, "cap": cap, "partitions": partitions}
        )
        leased = self._fetch("job_limited_leased", params)
        found: dict[tuple[str, str], LimitedPartition] = {}
        columns = waiting.columns()
        for row in waiting.rows:
            task, partition = row[columns["task"]], row[columns["partition"]]
            oldest = self._instant(row[columns["oldest"]])
            found[(task, partition)] = LimitedPartition(
                task, partition, int(row[columns["waiting"]]), oldest, 0
            )
        columns = leased.columns()
        for row in leased.rows:
            task, partition = row[columns["task"]], row[columns["partition"]]
            was = found.get((task, partition), LimitedPartition(task, partition, 0, None, 0))
            count = int(row[columns["leased"]])
            found[(task, partition)] = LimitedPartition(
                task, partition, was.waiting, was.oldest, count
            )
        return [found[k] for k in sorted(found)]

    @operation
    def outbox_next_due(self, channels: Sequence[str]) -> DueTime:
        """As `job_next_due`, for messages: each channel's head of oncebox_outbox_due."""
        due = self._record(DueTime, "outbox_next_due", {"channels": self._set(channels)})
        assert due is not None  # one row, always
        return due

    @operation
    def job_count_by_state(self) -> StateCounts:
        result = self._fetch("job_count_by_state", {})
        column = result.columns()
        state, outcome, count = column["state"], column["outcome"], column["count"]
        counts: dict[str, int] = {}
        for row in result.rows:
            counts[row[state]] = counts.get(row[state], 0) + row[count]
            if row[outcome]:
                counts[f"{row[state]}:{row[outcome]}"] = row[count]
        return StateCounts(counts)

    @operation
    def job_enqueue_conflict(self, key: str, connection: object | None = None) -> EnqueueConflict:
        found = self._record(EnqueueConflict, "job_enqueue_conflict", {"key": key}, connection)
        assert found is not None  # one row, always
        return found

    @operation
    def intent_get(self, key: str) -> IntentRow | None:
        return self._record(IntentRow, "intent_get", {"key": key})

    @operation
    def intent_count(self) -> int:
        return int(self._fetch("intent_count", {}).first("count"))

    def audit_list(self, target_id: int | None = None, limit: int = 100) -> list[AuditRow]:
        return self.audit_search(AuditFilter(target_id=target_id, limit=limit))

    @operation
    def audit_search(self, where: AuditFilter) -> list[AuditRow]:
        return self._records(AuditRow, "audit_list", asdict(where))

    # -- the outbox --------------------------------------------------------------------------

    @operation
    def outbox_get(self, outbox_id: int) -> OutboxRow | None:
        return self._record(OutboxRow, "outbox_get", {"id": outbox_id})

    @operation
    def outbox_find_by_key(self, key: str) -> list[OutboxRow]:
        return self._records(OutboxRow, "outbox_find_by_key", {"key": key})

    @operation
    def outbox_ambiguous_list(
        self, channels: Sequence[str], limit: int, after: int = 0
    ) -> list[OutboxRow]:
        params = {"channels": self._set(channels), "limit": limit, "after": after}
        return self._records(OutboxRow, "outbox_ambiguous_list", params)

    @operation
    def outbox_reported_list(
        self,
        channels: Sequence[str],
        accepted: Sequence[str],
        holding: Sequence[str],
        limit: int,
        after: int = 0,
    ) -> list[ReportedHold]:
        params = {
            "channels": self._set(channels),
            "accepted": self._set(accepted),
            "holding": self._set(holding),
            "limit": limit,
            "after": after,
        }
        return self._records(ReportedHold, "outbox_reported_list", params)

    @operation
    def provider_event_list(self, outbox_id: int) -> list[ProviderEventRow]:
        return self._records(ProviderEventRow, "provider_event_list", {"id": outbox_id})

    @operation
    def outbox_count_by_state(self) -> StateCounts:
        result = self._fetch("outbox_count_by_state", {})
        column = result.columns()
        state, count = column["state"], column["count"]
        return StateCounts({row[state]: row[count] for row in result.rows})

    @operation
    def delivery_attempt_list(self, outbox_id: int) -> list[DeliveryAttemptRow]:
        return self._records(DeliveryAttemptRow, "delivery_attempt_list", {"id": outbox_id})

    @operation
    def setting_get(self, name: str) -> str | None:
        value = self._fetch("setting_get", {"name": name}).first("value")
        return None if value is None else str(value)

    # -- the HTTP API --------------------------------------------------------------------------

    @operation
    def api_key_get(self, key_id: int) -> ApiKeyRow | None:
        return self._record(ApiKeyRow, "api_key_get", {"id": key_id})

    @operation
    def api_key_list(self) -> list[ApiKeyRow]:
        return self._records(ApiKeyRow, "api_key_list", {})

    @operation
    def api_request_get(self, api_key_id: int, idempotency_key: str) -> ApiRequestRow | None:
        params = {"api_key_id": api_key_id, "idempotency_key": idempotency_key}
        return self._record(ApiRequestRow, "api_request_get", params)

    # -- schedules ---------------------------------------------------------------------------

    @operation
    def schedule_state_list(self) -> list[tuple[str, bool, datetime | None]]:
        result = self._fetch("schedule_state_list", {})
        column = result.columns()
        name, paused, last = column["name"], column["paused"], column["last_fire_at"]
        return [(r[name], bool(r[paused]), self._instant(r[last])) for r in result.rows]

    @operation
    def schedule_period_pace(self, schedule: str, period: str) -> PeriodPace:
        params = {"schedule": schedule, "period": period}
        pace = self._record(PeriodPace, "schedule_period_pace", params)
        assert pace is not None  # an aggregate: one row, always
        return pace

    @operation
    def schedule_slo_list(self) -> dict[str, tuple[timedelta, float]]:
        result = self._fetch("schedule_slo_list", {})
        column = result.columns()
        name, window, target = column["name"], column["window_s"], column["target"]
        return {
            r[name]: (timedelta(seconds=float(r[window])), float(r[target])) for r in result.rows
        }

    @operation
    def schedule_run_list(self, schedule: str, limit: int = 50) -> list[ScheduleRunRow]:
        params = {"schedule": schedule, "limit": limit}
        return self._records(ScheduleRunRow, "schedule_run_list", params)

    @operation
    def schedule_run_stalled(self, schedule: str) -> list[ScheduleRunRow]:
        return self._records(ScheduleRunRow, "schedule_run_stalled", {"schedule": schedule})

    @operation
    def schedule_run_get(self, schedule: str, period: str) -> ScheduleRunRow | None:
        params = {"schedule": schedule, "period": period}
        return self._record(ScheduleRunRow, "schedule_run_get", params)

    @operation
    def schedule_run_running(self) -> list[ScheduleRunRow]:
        return self._records(ScheduleRunRow, "schedule_run_running", {})

    @operation
    def backlog_list(self) -> list[BacklogRow]:
        return self._records(BacklogRow, "backlog_list", {})

    @operation
    def worker_list(self, live_within: timedelta) -> list[WorkerRow]:
        result = self._fetch("worker_list", self._span("live", live_within))
        column = result.columns()
        rows = []
        for r in result.rows:
            served = {k: tuple(json.loads(r[column[k]])) for k in ("tasks", "queues", "channels")}
            rows.append(
                WorkerRow(
                    name=r[column["name"]],
                    host=r[column["host"]],
                    pid=r[column["pid"]],
                    started_at=self._required_instant(r[column["started_at"]]),
                    seen_at=self._required_instant(r[column["seen_at"]]),
                    stopped_at=self._instant(r[column["stopped_at"]]),
                    live=bool(r[column["live"]]),
                    **served,
                )
            )
        return rows

    @operation
    def schedule_run_busy(self, schedule: str, period: str) -> str | None:
        params = {"schedule": schedule, "period": period}
        value = self._fetch("schedule_run_busy", params).first("period")
        return None if value is None else str(value)

    @operation
    def status_times(self) -> StatusTimes:
        times = self._record(StatusTimes, "status_times", {})
        assert times is not None  # one row, always
        return times

    # -- listings ----------------------------------------------------------------------------

    def _listing(self, where: JobFilter | OutboxFilter) -> dict[str, Any]:
        """A listing's filter as parameters: its ages as the store's durations."""
        params = asdict(where)
        for name in ("older_than", "newer_than"):
            params.update(self._span(name, params.pop(name)))
        params["key_upper"] = key_range_end(where.key_prefix)
        return params

    @operation
    def job_list(self, where: JobFilter) -> list[JobRow]:
        return self._records(JobRow, "job_list", self._listing(where))

    @operation
    def outbox_list(self, where: OutboxFilter) -> list[OutboxRow]:
        return self._records(OutboxRow, "outbox_list", self._listing(where))

    @operation
    def schedule_period_stats(
        self, schedule: str, limit: int = 5, window: timedelta | None = None
    ) -> list[PeriodStats]:
        params = {"schedule": schedule, "limit": limit, **self._span("window", window)}
        return self._records(PeriodStats, "schedule_period_stats", params)

    # -- the key-drift guard -----------------------------------------------------------------

    def _canaries(self, result: Result) -> list[KeyCanary]:
        column = result.columns()
        kind, name, source = column["kind"], column["name"], column["source"]
        outputs, recorded_at = column["outputs"], column["recorded_at"]
        found = []
        for r in result.rows:
            listed = json.loads(r[outputs]) if isinstance(r[outputs], str) else r[outputs]
            found.append(
                KeyCanary(
                    r[kind],
                    r[name],
                    r[source],
                    tuple(str(o) for o in listed),
                    self._instant(r[recorded_at]),
                )
            )
        return found

    @operation
    def key_canary_list(self) -> list[KeyCanary]:
        return self._canaries(self._fetch("key_canary_list", {}))

    @operation
    def key_canary_get(self, kind: str, name: str) -> KeyCanary | None:
        found = self._canaries(self._fetch("key_canary_get", {"kind": kind, "name": name}))
        return found[0] if found else None

    @operation
    def limit_declaration_list(self) -> list[LimitDeclaration]:
        found = self._fetch("limit_declaration_list", {})
        task, limits, at = itemgetter("task", "limits", "declared_at")(found.columns())
        return [LimitDeclaration(r[task], r[limits], self._instant(r[at])) for r in found.rows]


def key_range_end(prefix: str | None) -> str | None:
    """The first string after every key that starts with `prefix`, in the keys' byte order
    (keys are ASCII, compared as bytes on both stores): the prefix with its last character
    moved one on. A key-prefix filter is then a range an index reads."""
    if not prefix:
        return None
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)
