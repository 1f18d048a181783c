"""The limits a lease applies, as plain data the store can take (`jobs/limits.py` builds it from
the tasks' declarations; `allocation.py` shares out what it allows)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class LimitRule:
    """One limit as the lease applies it: a slot count and/or a bucket, for the whole of its
    tasks or per partition. `tasks` are every task that declares it: the slots in use are
    counted over all of them."""

    name: str
    concurrency: int | None
    capacity: float | None  # a rate's bucket
    refill_per_s: float | None
    per_partition: bool
    tasks: tuple[str, ...]
    shown: str = ""  # as people wrote it: "4 at once", "100/min"


@dataclass(frozen=True, slots=True)
class LimitPlan:
    """The limits a lease applies: each limited task's rules, by name."""

    rules: Mapping[str, LimitRule]
    tasks: Mapping[str, tuple[str, ...]]  # task -> names of its rules

    def rules_of(self, task: str) -> list[LimitRule]:
        return [self.rules[name] for name in self.tasks.get(task, ())]

    def only(self, tasks: Iterable[str]) -> LimitPlan:
        """The plan for a worker serving `tasks` (its rules still count every task)."""
        wanted = set(tasks)
        served = {task: names for task, names in self.tasks.items() if task in wanted}
        return LimitPlan(
            {name: self.rules[name] for names in served.values() for name in names}, served
        )

    def __bool__(self) -> bool:
        return bool(self.tasks)


@dataclass(frozen=True, slots=True)
class LimitedPartition:
    """One partition of a limited task (jobs/limits.py): its due jobs waiting (counted up to a
    cap), the earliest due time among those counted, and its jobs leased now."""

    task: str
    partition: str  # '' for a task limited as a whole
    waiting: int
    oldest: datetime | None
    leased: int
