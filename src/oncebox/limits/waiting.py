"""What the limits hold back, per limit and per partition: the jobs running under it, the due
jobs waiting, and how long the oldest of them has waited — so a limit too tight, or a partition
starved by the others, shows in `status`, the metrics and the console.

Read with bounds, whatever the backlog: the first `PARTITIONS` partitions with ready jobs (a skip
scan, one probe each), and in each the first `CAP` due jobs in claim order — "100+" beyond, and
the oldest among those (the oldest of all when a partition's jobs share a priority).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from oncebox.store.params import LimitPlan, LimitRule
from oncebox.store.records import LimitedPartition

Read = Callable[[Sequence[str], int, int], list[LimitedPartition]]  # Store.job_limited_waiting

CAP = 100  # due jobs counted per partition
PARTITIONS = 1_000  # partitions read per scrape


@dataclass(frozen=True)
class LimitRow:
    name: str
    partition: str | None  # None: the limit as a whole
    limit: str  # as declared: "4 at once", "100/min per partition"
    concurrency: int | None
    running: int  # its tasks' jobs leased now
    waiting: int  # due and not leased (at most CAP per partition counted)
    capped: bool
    oldest: datetime | None  # the earliest due time among those counted


def held_back(read: Read, plan: LimitPlan) -> list[LimitRow]:
    """A row per limit as a whole, then one per partition of each per-partition limit; `read` is
    the store's `job_limited_waiting`."""
    if not plan:
        return []
    found = read(sorted(plan.tasks), CAP + 1, PARTITIONS)
    rows = []
    for rule in sorted(plan.rules.values(), key=lambda r: r.name):
        mine = [p for p in found if p.task in rule.tasks]
        rows.append(_row(rule, None, mine))
        if rule.per_partition:
            partitions = sorted({p.partition for p in mine})
            rows += [
                _row(rule, name, [p for p in mine if p.partition == name]) for name in partitions
            ]
    return rows


def _row(rule: LimitRule, partition: str | None, found: Iterable[LimitedPartition]) -> LimitRow:
    parts = list(found)
    return LimitRow(
        name=rule.name,
        partition=partition,
        limit=rule.shown,
        concurrency=rule.concurrency,
        running=sum(p.leased for p in parts),
        waiting=sum(min(p.waiting, CAP) for p in parts),
        capped=any(p.waiting > CAP for p in parts),
        oldest=min((p.oldest for p in parts if p.oldest is not None), default=None),
    )
