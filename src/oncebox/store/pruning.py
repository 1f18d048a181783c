"""Retention's store operations, shared by both stores: a batch pruned and counted in one
transaction, what retention holds, and the names it visits.

Each kind of row has two statements, in the `.sql` file of the noun it acts on: `<noun>_prune`
(a batch, oldest first, through the index migration 0014 built for it) and `<noun>_prunable`
(the oldest row kept and how many wait, with the same conditions). The count goes to the durable
counters in the batch's transaction, so `pruned_*` never counts a batch that rolled back. Jobs
are the exception: their batch also folds what each job counted into its period's summary, which
each store does its own way (`job_prune`).
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, Generic

from oncebox.kernel.metrics import operation
from oncebox.store.params import PruneKind
from oncebox.store.reads import ReadOperations
from oncebox.store.records import Held
from oncebox.store.writes import Tx

#: kind -> (batch statement, hold statement, the name's parameter, the counter it adds to)
STATEMENTS: dict[PruneKind, tuple[str, str, str | None, str]] = {
    "jobs": ("job_prune", "job_prunable", "task", "pruned_jobs"),
    "intents": ("intent_prune", "intent_prunable", "task", "pruned_intents"),
    "payloads": ("outbox_payload_drop", "outbox_payload_prunable", "channel", "payloads_dropped"),
    "messages": ("outbox_prune", "outbox_prunable", "channel", "pruned_messages"),
    "delivery_attempts": (
        "delivery_attempt_prune",
        "delivery_attempt_prunable",
        None,
        "pruned_delivery_attempts",
    ),
    "provider_events": (
        "provider_event_prune",
        "provider_event_prunable",
        None,
        "pruned_provider_events",
    ),
    "audit": ("audit_prune", "audit_prunable", None, "pruned_audit_entries"),
    "schedule_runs": (
        "schedule_run_prune",
        "schedule_run_prunable",
        "schedule",
        "pruned_schedule_runs",
    ),
}


class PruneOperations(ReadOperations, Generic[Tx]):
    """See the module docstring."""

    def _transaction(self) -> AbstractContextManager[Tx]:
        raise NotImplementedError

    def job_prune(self, task: str, older_than: timedelta, limit: int) -> int:
        raise NotImplementedError

    def _prune_in(self, tx: Tx, kind: PruneKind, params: dict[str, Any]) -> int:
        """One batch in `tx`: the rows it acted on. SQLite deletes a message's attempts in a
        step of its own (no data-modifying CTEs)."""
        return len(tx.fetch(STATEMENTS[kind][0], params).rows)

    def _params(self, kind: PruneKind, name: str, older_than: timedelta | None) -> dict[str, Any]:
        param = STATEMENTS[kind][2]
        return {**({} if param is None else {param: name}), **self._span("older_than", older_than)}

    @operation
    def prune(self, kind: PruneKind, name: str, older_than: timedelta, limit: int) -> int:
        if kind == "jobs":
            return self.job_prune(name, older_than, limit)
        with self._transaction() as tx:
            acted = self._prune_in(
                tx, kind, {**self._params(kind, name, older_than), "limit": limit}
            )
            if acted:
                tx.fetch("counter_add", {"deltas": json.dumps({STATEMENTS[kind][3]: acted})})
        return acted

    @operation
    def prunable(
        self, kind: PruneKind, name: str, older_than: timedelta | None, limit: int
    ) -> Held:
        params = {**self._params(kind, name, older_than), "limit": limit}
        result = self._fetch(STATEMENTS[kind][1], params)
        return Held(self._instant(result.first("oldest")), int(result.first("waiting") or 0))

    @operation
    def prune_names(self, kind: PruneKind) -> list[str]:
        if kind == "jobs":
            params = {"kind": "job", "states": self._set(["done", "cancelled"])}
            result = self._fetch("depth_names", params)
        elif kind in ("payloads", "messages"):
            result = self._fetch("depth_names", {"kind": "message", "states": self._set(["sent"])})
        elif kind == "intents":
            result = self._fetch("intent_tasks", {})
        elif kind == "schedule_runs":
            result = self._fetch("schedule_run_schedules", {})
        else:
            return [""]
        index = result.columns()["name"]
        return [row[index] for row in result.rows]
