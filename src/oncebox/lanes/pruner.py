"""`Pruner`: the lane that applies retention (`policy.py`), a bounded batch at a time.

Each pass visits every kind of row in `ORDER` — jobs first, so that the messages whose jobs
just went may follow in the same pass — and, for each task, channel or schedule that
has such rows (read from the depths and small tables, never by scanning the big ones), prunes one
batch of at most `batch_size` rows, oldest first through an index (migration 0014). A batch is
one short transaction that locks only its own rows and skips any another transaction holds.

While batches come back full the lane goes on, but paced: after a pass it waits four times as
long as the pass took (`duty` 0.2: a fifth of its time pruning), so a backlog of millions of
rows drains at a steady rate instead of taking a core and the disk from the workers. With
nothing past its retention a pass is a few index probes, every `interval`.

What a pruned job of a schedule period counted is kept in its run's summary (`job_prune`); the
totals of what was pruned are durable counters (`pruned_*`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import timedelta

from oncebox.kernel.clock import monotonic
from oncebox.lanes.lane import run_forever
from oncebox.retention.policy import Plan, by_week
from oncebox.runtime.runtime import Runtime
from oncebox.store.params import PRUNE_KINDS, PruneKind
from oncebox.store.protocol import Store

#: Jobs first, so that the messages whose jobs just went may follow in the same pass; messages
#: before payloads, so that a row past both is deleted, not first rewritten without its payload.
ORDER: tuple[PruneKind, ...] = (
    "jobs",
    "intents",
    "messages",
    "payloads",
    "delivery_attempts",
    "provider_events",
    "audit",
    "schedule_runs",
)
assert sorted(ORDER) == sorted(PRUNE_KINDS)
#: How far ahead the history's weekly partitions are made: a pruner stopped for up to four
#: weeks still finds every week made (and a row whose week is late waits in the default one).
HISTORY_AHEAD = timedelta(weeks=4)


@dataclass(frozen=True)
class PrunerConfig:
    interval: timedelta = timedelta(minutes=10)
    batch_size: int = 1000
    # the largest share of its time a draining pruner spends pruning: at 0.2 it removed 14 000
    # rows/s with a worker's throughput within the noise (docs/benchmarks.md, bench/retention.py)
    duty: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.duty <= 1:
            raise ValueError("duty must be within (0, 1]")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


@dataclass
class PrunerResult:
    """Rows acted on per kind, and whether any batch came back full (more is waiting)."""

    pruned: dict[PruneKind, int] = field(default_factory=lambda: dict.fromkeys(PRUNE_KINDS, 0))
    full: bool = False
    moved: int = 0  # finished jobs moved into the history (a deployment from before it)

    def total(self) -> int:
        return sum(self.pruned.values())


class Pruner:
    def __init__(self, store: Store, config: PrunerConfig, plan: Plan) -> None:
        self.store = store
        self.config = config
        self.plan = plan

    @classmethod
    def for_runtime(cls, runtime: Runtime, config: PrunerConfig) -> Pruner:
        """The pruner of a box: its retention, tasks, channels and schedules."""
        return cls(runtime.store, config, plan_for(runtime))

    def run_once(self) -> PrunerResult:
        """One pass: the history's weeks made ahead and a batch of finished jobs from before
        it moved in (`Store.job_history_tend`), then a batch per kind and name past its
        retention."""
        result = PrunerResult()
        if self.store.keeps_history:
            tended = self.store.job_history_tend(HISTORY_AHEAD, self.config.batch_size)
            result.moved = tended.moved
            result.full = tended.moved >= self.config.batch_size
            # a whole week of finished jobs, when all of it may go: no batch to delete
            tasks = {t: self.plan.policy("jobs", t) for t in self.plan.tasks}
            dropped = self.store.job_history_drop(tasks, self.plan.retention.jobs)
            result.pruned["jobs"] += dropped
            result.full = result.full or dropped > 0
        deleting: set[str] = set()  # channels whose message batch came back full
        now = self.store.clock_now()
        for kind in ORDER:
            if kind == "jobs" and result.pruned["jobs"]:
                continue  # a week went whole: the next pass sees whether the next one may
            for name in self._names(kind):
                keep = self.plan.policy(kind, name)
                if keep is None or _moot(kind, name, deleting):
                    continue
                if kind == "jobs" and self.store.keeps_history:
                    keep = by_week(keep, now)
                acted = self.store.prune(kind, name, keep, self.config.batch_size)
                result.pruned[kind] += acted
                if acted >= self.config.batch_size:
                    result.full = True
                    if kind == "messages":
                        deleting.add(name)
        self.store.counter_compact()  # the shards of connections that are gone, folded
        return result

    def _names(self, kind: PruneKind) -> list[str]:
        """The names to visit: for intents, only the tasks that set `keep_intents=` (the
        others keep theirs for ever); else what the store has rows of."""
        if kind == "intents":
            return sorted(t for t in self.plan.tasks if self.plan.policy(kind, t) is not None)
        return self.store.prune_names(kind)

    def drain(self) -> PrunerResult:
        """Passes until no batch comes back full: everything past its retention, pruned (what
        `oncebox prune` runs). Unpaced: an operator's command, at an hour they chose."""
        total = PrunerResult()
        while True:
            result = self.run_once()
            for kind, acted in result.pruned.items():
                total.pruned[kind] += acted
            total.moved += result.moved
            if not result.full:
                return total

    def step(self) -> tuple[PrunerResult, float]:
        """One pass, and how long to wait before the next: after a pass with a full batch,
        `took * (1 - duty) / duty` (four times the pass at 0.2) — the pacing a draining pruner
        keeps (`run_forever`, and `bench/retention.py`'s pruner, which is this one); else the
        interval."""
        started = monotonic()
        result = self.run_once()
        if not result.full:
            return result, self.config.interval.total_seconds()
        took = monotonic() - started
        return result, took * (1 - self.config.duty) / self.config.duty

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            result, pause = self.step()
            if result.full:
                stop.wait(pause)
            return result.full

        run_forever("pruner", once, stop, self.config.interval.total_seconds())


def _moot(kind: PruneKind, name: str, deleting: set[str]) -> bool:
    """Whether this pass should leave `kind` of `name` alone: while a channel's old messages are
    still being deleted, dropping payloads or attempts that the next batches delete anyway would
    rewrite rows only to delete them."""
    return bool(deleting) and (
        kind == "delivery_attempts" or (kind == "payloads" and name in deleting)
    )


def plan_for(runtime: Runtime) -> Plan:
    """The policies of a box: its `Retention`, and its tasks', channels' and schedules' own."""
    return Plan(
        runtime.retention,
        {task.name: task for task in runtime.registry.all()},
        runtime.channels,
        dict(runtime.schedules),
    )
