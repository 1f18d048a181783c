"""The `--json` shapes of the CLI, in one place (documented in docs/cli.md).

Times are ISO 8601 in UTC with a `Z`; absent values are `null`; payloads and job arguments are
parsed JSON, not strings. Shapes only grow: a field, once documented, keeps its name and meaning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from oncebox.jobs.dead_letters import DeadLetter, DiscardPlan, ReplayPlan
from oncebox.jobs.declarations import QuietLimit
from oncebox.kernel.clock import ClockSetting
from oncebox.limits.waiting import LimitRow
from oncebox.retention.held import HeldRow
from oncebox.schedules.owners import RunOwner, judge
from oncebox.schedules.slo import PeriodSlo, Slo
from oncebox.store.records import (
    AttemptRow,
    AuditRow,
    BacklogRow,
    DeliveryAttemptRow,
    DiscardResult,
    JobRow,
    OutboxRow,
    PeriodStats,
    ProviderEventRow,
)

if TYPE_CHECKING:  # shapes of them; the module stays importable without the operations layer
    from oncebox.jobs.receipts import ReceiptChain
    from oncebox.runtime.operations import ActionOutcome


def instant(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def job(row: JobRow, attempts: list[AttemptRow] | None = None) -> dict[str, Any]:
    shape: dict[str, Any] = {
        "id": row.id,
        "key": row.key,
        "task": row.task,
        "queue": row.queue,
        "args": json.loads(row.args_json),
        "state": row.state,
        "outcome": row.outcome,
        "attempt": row.attempt,
        "max_attempts": row.max_attempts,
        "priority": row.priority,
        "group": row.group_key,
        "schedule": row.schedule,
        "period": row.period,
        "run_at": instant(row.run_at),
        "created_at": instant(row.created_at),
        "finished_at": instant(row.finished_at),
        "leased_by": row.leased_by,
        "lease_expires_at": instant(row.lease_expires_at),
        "last_error": row.last_error,
    }
    if attempts is not None:
        shape["attempts"] = [
            {
                "attempt": a.attempt,
                "outcome": a.outcome,
                "worker": a.worker,
                "started_at": instant(a.started_at),
                "finished_at": instant(a.finished_at),
                "error": a.error,
                "note": a.note,
            }
            for a in attempts
        ]
    return shape


def message(
    row: OutboxRow,
    attempts: list[DeliveryAttemptRow] | None = None,
    events: list[ProviderEventRow] | None = None,
) -> dict[str, Any]:
    payload = json.loads(row.payload_json)
    shape: dict[str, Any] = {
        "id": row.id,
        "key": row.key,
        "intent_key": row.intent_key,
        "channel": row.channel,
        "state": row.state,
        "to": payload.get("to") if isinstance(payload, dict) else None,
        "subject": payload.get("subject") if isinstance(payload, dict) else None,
        "token": row.token,
        "job_id": row.job_id,
        "attempt": row.attempt,
        "possible_duplicates": row.possible_duplicates,
        "rescues": row.rescues,
        "created_at": instant(row.created_at),
        "next_attempt_at": instant(row.next_attempt_at),
        "sent_at": instant(row.sent_at),
        "receipt": row.receipt,
        "last_error": row.last_error,
        "payload_dropped_at": instant(row.payload_dropped_at),
        "reported": row.reported,
        "reported_at": instant(row.reported_at),
    }
    if events is not None:
        shape["provider_events"] = [
            {
                "kind": e.kind,
                "event_id": e.event_id,
                "provider_id": e.provider_id,
                "occurred_at": instant(e.occurred_at),
                "received_at": instant(e.received_at),
            }
            for e in events
        ]
    if attempts is not None:
        shape["payload"] = None if row.payload_dropped_at is not None else payload
        shape["attempts"] = [
            {
                "attempt": a.attempt,
                "outcome": a.outcome,
                "worker": a.worker,
                "started_at": instant(a.started_at),
                "finished_at": instant(a.finished_at),
                "error": a.error,
                "receipt": a.receipt,
            }
            for a in attempts
        ]
    return shape


def held(row: HeldRow, now: datetime) -> dict[str, Any]:
    """What retention holds of one kind of row for one task, channel or schedule."""
    return {
        "kind": row.kind,
        "name": row.name,
        "keep_s": None if row.keep is None else row.keep.total_seconds(),
        "oldest": instant(row.oldest),
        "oldest_age_s": None
        if row.oldest is None
        else round(max(0.0, (now - row.oldest).total_seconds()), 3),
        "waiting": row.waiting,
        "waiting_capped": row.capped,
    }


def limit(row: LimitRow, now: datetime) -> dict[str, Any]:
    """What one limit holds back, as a whole (`partition` null) or in one partition."""
    return {
        "limit": row.name,
        "partition": row.partition,
        "declared": row.limit,
        "concurrency": row.concurrency,
        "running": row.running,
        "waiting": row.waiting,
        "waiting_capped": row.capped,
        "oldest_wait_s": None
        if row.oldest is None
        else round(max(0.0, (now - row.oldest).total_seconds()), 3),
    }


def quiet_limit(entry: QuietLimit) -> dict[str, Any]:
    """A task's jobs held by limits no process has declared lately (jobs/declarations.py)."""
    return {
        "task": entry.task,
        "declared": entry.limits,
        "last_declared_at": instant(entry.declared_at),
        "waiting": entry.waiting,
        "waiting_capped": entry.capped,
        "freed_at": instant(entry.freed_at),
    }


PARTITIONS_SHOWN = 10  # partitions per limit that status and the console list


def limits_shown(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`limit` entries as people read them: each limit as a whole, then its partitions that
    wait longest (at most `PARTITIONS_SHOWN`), so a starved one is on screen."""
    shown: list[dict[str, Any]] = []
    for entry in entries:
        if entry["partition"] is None:
            shown.append(entry)
            parts = [
                e for e in entries if e["limit"] == entry["limit"] and e["partition"] is not None
            ]
            parts.sort(key=lambda e: (-(e["oldest_wait_s"] or 0.0), -e["waiting"], e["partition"]))
            shown += parts[:PARTITIONS_SHOWN]
    return shown


def receipts(chain: ReceiptChain) -> dict[str, Any]:
    """A key's receipt chain (`oncebox.jobs.receipts`): the intent, its jobs and messages with their
    attempts, and the audit entries about them, newest first."""
    intent = chain.intent
    return {
        "key": chain.key,
        "intent": None
        if intent is None
        else {
            "key": intent.key,
            "task": intent.task,
            "job_id": intent.job_id,
            "claimed_at": instant(intent.claimed_at),
        },
        "jobs": [job(j.job, j.attempts) for j in chain.jobs],
        "messages": [message(m.message, m.attempts) for m in chain.messages],
        "audit": [audit(a) for a in chain.audit],
    }


def audit(row: AuditRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": instant(row.at),
        "actor": row.actor,
        "action": row.action,
        "target_kind": row.target_kind,
        "target_id": row.target_id,
        "target_key": row.target_key,
        "reason": row.reason,
        "details": json.loads(row.details) if row.details else None,
    }


def fan_out(schedule: str, period: str, held: RunOwner) -> dict[str, Any]:
    """A running fan-out: who owns it, whether that owner is alive (it renews its run while it
    fans out: `schedules/owners.py`), when it last renewed, when its lease ends."""
    return {
        "schedule": schedule,
        "period": period,
        "owner": held.owner,
        "owner_live": held.live,
        "renewed_at": instant(held.renewed_at),
        "lease_ends_at": instant(held.lease_ends_at),
    }


def period(
    stats: PeriodStats,
    judged: PeriodSlo | None = None,
    *,
    schedule: str = "",
    now: datetime | None = None,
) -> dict[str, Any]:
    """A period's figures; a running one's `fan_out` (its owner judged at `now`), or null."""
    coverage = stats.coverage
    held = None if now is None or stats.state != "running" else judge(stats, now)
    return {
        "period": stats.period,
        "state": stats.state,
        "eligible": stats.eligible,
        "enqueued": stats.enqueued,
        "done": stats.done,
        "covered": stats.covered,
        "sent": stats.sent,
        "pending": stats.pending,
        "dead": stats.dead,
        "ambiguous": stats.ambiguous,
        "coverage": None if coverage is None else round(coverage, 4),
        "pruned": stats.pruned,
        "duplicates": stats.duplicates,
        "fire_at": instant(stats.fire_at),
        "slo": None if judged is None else period_slo(judged),
        "fan_out": None if held is None else fan_out(schedule, stats.period, held),
    }


def slo(declared: Slo) -> dict[str, Any]:
    return {"deliver_within_s": declared.deliver_within.total_seconds(), "target": declared.target}


def period_slo(judged: PeriodSlo) -> dict[str, Any]:
    return {
        "window_ends_at": instant(judged.window_ends_at),
        "closed": judged.closed,
        "on_time": judged.on_time,
        "sli": None if judged.sli is None else round(judged.sli, 4),
        "allowed_misses": judged.allowed_misses,
        "misses": judged.misses,
        "budget_left": judged.budget_left,
        "projected_misses": judged.projected_misses,
        "at_risk": judged.at_risk,
    }


def clock_shape(setting: ClockSetting, now: datetime) -> dict[str, Any]:
    """The database's clock: `mode` is `real`, `frozen` or `offset` — what `oncebox_now()`
    returns now (a lapsed setting reads `real`, with `lapsed` true and the setting kept)."""
    set_at = setting.frozen_at is not None or setting.offset is not None
    mode = "real" if setting.is_real else "frozen" if setting.frozen_at is not None else "offset"
    return {
        "mode": mode,
        "now": instant(now),
        "frozen_at": instant(setting.frozen_at),
        "offset_seconds": setting.offset.total_seconds() if setting.offset is not None else None,
        "owner": setting.owner if set_at else None,
        "expires_at": instant(setting.expires_at) if set_at else None,
        "lapsed": setting.lapsed,
    }


def backlog(row: BacklogRow) -> dict[str, Any]:
    """Work not finished for one task (`kind` job) or channel (message)."""
    return {
        "kind": row.kind,
        "name": row.name,
        "waiting": row.waiting,
        "next_due_at": instant(row.next_due_at),
        "held": row.held,
        "held_until": instant(row.held_until),
    }


def backlog_row(data: dict[str, Any]) -> BacklogRow:
    """The inverse of `backlog`, for text output built from the same data as `--json`."""
    return BacklogRow(
        kind=data["kind"],
        name=data["name"],
        waiting=data["waiting"],
        next_due_at=_parsed(data["next_due_at"]),
        held=data["held"],
        held_until=_parsed(data["held_until"]),
    )


def _parsed(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def discard(done: DiscardResult) -> dict[str, Any]:
    return {
        "id": done.id,
        "key": done.key,
        "renamed": done.renamed,
        "intent_key": done.intent_key,
        "kept": [{"key": key, "state": state} for key, state in done.kept],
        "intent_released": done.intent_released,
        "job_reopened": done.job_reopened,
        "audit_id": done.audit_id,
    }


def letter(row: DeadLetter) -> dict[str, Any]:
    return {
        "kind": row.kind,
        "id": row.id,
        "key": row.key,
        "task": row.task,
        "channel": row.channel,
        "attempt": row.attempt,
        "died_at": instant(row.died_at),
        "last_error": row.last_error,
    }


def plan(planned: ReplayPlan | DiscardPlan) -> dict[str, Any]:
    """A dry run: what a batch would do (`rows`), what a discard would refuse, and why."""
    shape: dict[str, Any] = {
        "action": "replay" if isinstance(planned, ReplayPlan) else "discard",
        "dry_run": True,
        "count": planned.count,
        "more": planned.more,
        "planned_at": instant(planned.planned_at),
        "rows": [letter(row) for row in planned.rows],
    }
    if isinstance(planned, DiscardPlan):
        shape["refused"] = [{**letter(r.letter), "why": r.why} for r in planned.refused]
    return shape


def discarded(outcome: ActionOutcome) -> dict[str, Any]:
    return {
        "kind": outcome.kind,
        "id": outcome.id,
        "key": outcome.key,
        "audit_id": outcome.audit_id,
        "discard": None if outcome.discard is None else discard(outcome.discard),
    }
