"""The read operations both stores share: the same named queries, mapped to the same rows.

A store supplies `_rows(name, params)` (run a named query, return its rows) and `_instant(value)`
(its stored instant as an aware UTC datetime: microseconds on SQLite, timestamptz on
PostgreSQL); everything else about reading jobs, attempts, intents and the audit log is here once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from oncebox.metrics import Metrics, operation
from oncebox.store.base import (
    AttemptRow,
    AuditFilter,
    AuditRow,
    DeliveryAttemptRow,
    IntentRow,
    JobFilter,
    JobRow,
    KeyCanary,
    LeasedJob,
    OutboxFilter,
    OutboxLeased,
    OutboxRow,
    PeriodStats,
    ScheduleRunRow,
    StateCounts,
    StatusTimes,
)


class ReadOperations:
    metrics: Metrics

    def _rows(self, name: str, params: dict[str, Any]) -> list[Any]:
        raise NotImplementedError

    def _instant(self, value: Any) -> datetime | None:
        raise NotImplementedError

    def _required_instant(self, value: Any) -> datetime:
        instant = self._instant(value)
        assert instant is not None
        return instant

    def _job_row(self, row: Sequence[Any]) -> JobRow:
        at, required = self._instant, self._required_instant
        return JobRow(
            id=row[0],
            key=row[1],
            task=row[2],
            queue=row[3],
            args_json=row[4],
            state=row[5],
            outcome=row[6] or None,
            priority=row[7],
            group_key=row[8],
            attempt=row[9],
            max_attempts=row[10],
            attempt_base=row[11],
            run_at=required(row[12]),
            expires_at=at(row[13]),
            created_at=required(row[14]),
            leased_by=row[15],
            leased_at=at(row[16]),
            lease_expires_at=at(row[17]),
            finished_at=at(row[18]),
            last_error=row[19],
            schedule=row[20],
            period=row[21],
        )

    def _leased_jobs(self, rows: Sequence[Sequence[Any]]) -> list[LeasedJob]:
        """Rows of `job_lease`, in claim order (RETURNING gives no order)."""
        seen: dict[Any, datetime | None] = {}  # a batch shares its lease time, often more

        def at(value: Any) -> datetime | None:
            if value not in seen:
                seen[value] = self._instant(value)
            return seen[value]

        def required(value: Any) -> datetime:
            instant = at(value)
            assert instant is not None
            return instant

        leased = [
            LeasedJob(
                id=r[0],
                key=r[1],
                task=r[2],
                queue=r[3],
                args_json=r[4],
                attempt=r[5],
                max_attempts=r[6],
                attempt_base=r[7],
                priority=r[8],
                group_key=r[9],
                run_at=required(r[10]),
                created_at=required(r[11]),
                expires_at=at(r[12]),
                leased_at=required(r[13]),
            )
            for r in rows
        ]
        leased.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return leased

    @operation
    def job_get(self, job_id: int) -> JobRow | None:
        rows = self._rows("job_get", {"id": job_id})
        return self._job_row(rows[0]) if rows else None

    @operation
    def job_find_by_key(self, key: str) -> list[JobRow]:
        return [self._job_row(r) for r in self._rows("job_find_by_key", {"key": key})]

    @operation
    def job_attempt_list(self, job_id: int) -> list[AttemptRow]:
        return [
            AttemptRow(
                r[0],
                r[1],
                r[2],
                self._instant(r[3]),
                self._required_instant(r[4]),
                r[5],
                r[6],
                r[7],
            )
            for r in self._rows("job_attempt_list", {"id": job_id})
        ]

    @operation
    def job_count_by_state(self) -> StateCounts:
        counts: dict[str, int] = {}
        for state, outcome, count in self._rows("job_count_by_state", {}):
            counts[state] = counts.get(state, 0) + count
            if outcome:
                counts[f"{state}:{outcome}"] = count
        return StateCounts(counts)

    @operation
    def intent_get(self, key: str) -> IntentRow | None:
        rows = self._rows("intent_get", {"key": key})
        if not rows:
            return None
        key_, task, job_id, claimed_at = rows[0]
        return IntentRow(key_, task, job_id, self._required_instant(claimed_at))

    @operation
    def intent_count(self) -> int:
        return int(self._rows("intent_count", {})[0][0])

    def audit_list(self, target_id: int | None = None, limit: int = 100) -> list[AuditRow]:
        return self.audit_search(AuditFilter(target_id=target_id, limit=limit))

    @operation
    def audit_search(self, where: AuditFilter) -> list[AuditRow]:
        return [
            AuditRow(r[0], self._required_instant(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], r[8])
            for r in self._rows("audit_list", asdict(where))
        ]

    # -- the outbox --------------------------------------------------------------------------

    def _outbox_row(self, r: Sequence[Any]) -> OutboxRow:
        at, required = self._instant, self._required_instant
        return OutboxRow(
            id=r[0],
            key=r[1],
            intent_key=r[2],
            channel=r[3],
            payload_json=r[4],
            token=r[5],
            job_id=r[6],
            state=r[7],
            attempt=r[8],
            attempt_base=r[9],
            possible_duplicates=r[10],
            next_attempt_at=required(r[11]),
            created_at=required(r[12]),
            first_leased_at=at(r[13]),
            leased_by=r[14],
            lease_token=r[15],
            lease_expires_at=at(r[16]),
            sent_at=at(r[17]),
            receipt=r[18],
            last_error=r[19],
            uncertain=bool(r[20]),
        )

    def _leased_outbox(self, rows: Sequence[Sequence[Any]], token: str) -> list[OutboxLeased]:
        required = self._required_instant
        leased = [
            OutboxLeased(
                id=r[0],
                key=r[1],
                intent_key=r[2],
                channel=r[3],
                payload_json=r[4],
                token=r[5],
                attempt=r[6],
                attempt_base=r[7],
                possible_duplicates=r[8],
                first_leased_at=required(r[9]),
                leased_at=required(r[10]),
                lease_token=token,
                uncertain=bool(r[11]),
            )
            for r in rows
        ]
        leased.sort(key=lambda row: row.id)
        return leased

    @operation
    def outbox_get(self, outbox_id: int) -> OutboxRow | None:
        rows = self._rows("outbox_get", {"id": outbox_id})
        return self._outbox_row(rows[0]) if rows else None

    @operation
    def outbox_find_by_key(self, key: str) -> list[OutboxRow]:
        return [self._outbox_row(r) for r in self._rows("outbox_find_by_key", {"key": key})]

    @operation
    def outbox_count_by_state(self) -> StateCounts:
        return StateCounts(
            {state: count for state, count in self._rows("outbox_count_by_state", {})}
        )

    @operation
    def delivery_attempt_list(self, outbox_id: int) -> list[DeliveryAttemptRow]:
        return [
            DeliveryAttemptRow(
                r[0],
                r[1],
                r[2],
                self._instant(r[3]),
                self._required_instant(r[4]),
                r[5],
                r[6],
                r[7],
            )
            for r in self._rows("delivery_attempt_list", {"id": outbox_id})
        ]

    @operation
    def setting_get(self, name: str) -> str | None:
        rows = self._rows("setting_get", {"name": name})
        return str(rows[0][0]) if rows else None

    # -- schedules ---------------------------------------------------------------------------

    @operation
    def schedule_state_list(self) -> list[tuple[str, bool, datetime | None]]:
        return [
            (r[0], bool(r[1]), self._instant(r[2])) for r in self._rows("schedule_state_list", {})
        ]

    def _schedule_run_row(self, r: Sequence[Any]) -> ScheduleRunRow:
        at = self._instant
        return ScheduleRunRow(
            schedule=r[0],
            period=r[1],
            fire_at=at(r[2]),
            state=r[3],
            owner=r[4],
            lease_expires_at=at(r[5]),
            started_at=self._required_instant(r[6]),
            finished_at=at(r[7]),
            scans=r[8],
            eligible_count=r[9],
            enqueued_count=r[10],
            late=bool(r[11]),
        )

    @operation
    def schedule_run_list(self, schedule: str, limit: int = 50) -> list[ScheduleRunRow]:
        rows = self._rows("schedule_run_list", {"schedule": schedule, "limit": limit})
        return [self._schedule_run_row(r) for r in rows]

    @operation
    def schedule_run_stalled(self, schedule: str) -> list[ScheduleRunRow]:
        rows = self._rows("schedule_run_stalled", {"schedule": schedule})
        return [self._schedule_run_row(r) for r in rows]

    @operation
    def schedule_run_busy(self, schedule: str, period: str) -> str | None:
        rows = self._rows("schedule_run_busy", {"schedule": schedule, "period": period})
        return str(rows[0][0]) if rows else None

    @operation
    def status_times(self) -> StatusTimes:
        at = self._instant
        r = self._rows("status_times", {})[0]
        return StatusTimes(
            at(r[0]), at(r[1]), at(r[2]), at(r[3]), at(r[4]), at(r[5]), self._required_instant(r[6])
        )

    # -- listings ----------------------------------------------------------------------------

    @operation
    def job_list(self, where: JobFilter) -> list[JobRow]:
        return [self._job_row(r) for r in self._rows("job_list", asdict(where))]

    @operation
    def outbox_list(self, where: OutboxFilter) -> list[OutboxRow]:
        return [self._outbox_row(r) for r in self._rows("outbox_list", asdict(where))]

    @operation
    def schedule_period_stats(self, schedule: str, limit: int = 5) -> list[PeriodStats]:
        rows = self._rows("schedule_period_stats", {"schedule": schedule, "limit": limit})
        return [PeriodStats(r[0], r[1], r[2], *(int(v) for v in r[3:])) for r in rows]

    # -- the key-drift guard -----------------------------------------------------------------

    def _canary(self, r: Sequence[Any]) -> KeyCanary:
        outputs = json.loads(r[3]) if isinstance(r[3], str) else r[3]
        return KeyCanary(r[0], r[1], r[2], tuple(str(o) for o in outputs), self._instant(r[4]))

    @operation
    def key_canary_list(self) -> list[KeyCanary]:
        return [self._canary(r) for r in self._rows("key_canary_list", {})]

    @operation
    def key_canary_get(self, kind: str, name: str) -> KeyCanary | None:
        rows = self._rows("key_canary_get", {"kind": kind, "name": name})
        return self._canary(rows[0]) if rows else None
