"""What retention holds, per kind of row and per task, channel or schedule: the policy in force,
the oldest row still kept, and how many rows are past their retention — waiting for the pruner.

`status` (and so `oncebox metrics`) reads it with the counts capped at 1 000 rows per kind
and name, so a scrape's cost is bounded whatever the backlog; `oncebox prune --dry-run` reads
it uncapped: what the pruner's batches would take now, with the same conditions (a drain takes
a little more: the messages of the jobs it deletes first).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from oncebox.retention.policy import Plan, by_week
from oncebox.store.params import PRUNE_KINDS, PruneKind
from oncebox.store.protocol import Store

#: kind -> what an operator calls those rows
KIND_LABELS = {
    "jobs": "finished jobs",
    "intents": "intents",
    "payloads": "message payloads",
    "messages": "sent messages",
    "delivery_attempts": "delivery attempts",
    "provider_events": "provider events",
    "audit": "audit entries",
    "schedule_runs": "schedule runs",
}

STATUS_CAP = 1_000  # rows counted per kind and name by `status`: "1000+" beyond
UNCAPPED = 2**62


@dataclass(frozen=True)
class HeldRow:
    kind: PruneKind
    name: str  # task, channel or schedule; '' for delivery attempts and the audit
    keep: timedelta | None  # None: kept for ever
    oldest: datetime | None  # the oldest row of the kind the policy applies to (None: none)
    waiting: int  # past retention, not yet pruned (at most the cap)
    capped: bool  # more than `waiting` are past retention


def held(store: Store, plan: Plan, cap: int | None = STATUS_CAP) -> list[HeldRow]:
    """Every kind and name that has rows, in pruning order."""
    rows = []
    now = store.clock_now()
    for kind in PRUNE_KINDS:
        for name in store.prune_names(kind):
            keep = plan.policy(kind, name)
            weekly = keep is not None and kind == "jobs" and store.keeps_history
            asked = by_week(keep, now) if weekly and keep is not None else keep
            found = store.prunable(kind, name, asked, UNCAPPED if cap is None else cap + 1)
            capped = cap is not None and found.waiting > cap
            waiting = min(found.waiting, cap) if cap is not None else found.waiting
            rows.append(HeldRow(kind, name, keep, found.oldest, waiting, capped))
    return rows


def kept(seconds: float | None) -> str:
    """14d, 12h, 90m, for ever: a retention as people set it."""
    if seconds is None:
        return "for ever"
    whole = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"
