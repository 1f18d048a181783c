"""`Pruner`: retention for finished jobs, and the explicit per-task intent policies.

Done and cancelled jobs (with their attempt history) are deleted `job_retention` after they
finished (default 14 days), a small batch per statement so the lane never holds long locks.
Dead jobs are never pruned: they wait for a replay or an operator; nor is a job with a message
not yet sent (pending, held ambiguous, dead): its period's figures still move with it. What a
pruned job of a schedule period counted is kept in its run's summary, in the same statement, so
the period's figures outlive its jobs (`job_prune`, migration 0011).

Intents are tombstones that must outlive every way a duplicate can arrive, so they are kept
forever unless a task declares `keep_intents=` (e.g. 400 days for weekly digests): only then does
this lane delete that task's intents claimed longer ago than that. Deleting jobs never deletes
intents.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from oncebox.jobs.tasks import Task
from oncebox.lane import run_forever
from oncebox.store.base import Store

DEFAULT_JOB_RETENTION = timedelta(days=14)


@dataclass(frozen=True)
class PrunerConfig:
    job_retention: timedelta = DEFAULT_JOB_RETENTION
    interval: timedelta = timedelta(minutes=10)
    batch_size: int = 1000

    def __post_init__(self) -> None:
        if self.job_retention < timedelta(0):
            raise ValueError("job_retention must not be negative")


@dataclass(frozen=True)
class PrunerResult:
    jobs: int
    intents: int


class Pruner:
    def __init__(self, store: Store, config: PrunerConfig, tasks: Sequence[Task]) -> None:
        self.store = store
        self.config = config
        self.tasks = list(tasks)

    def run_once(self) -> PrunerResult:
        jobs = self.store.job_prune(self.config.job_retention, self.config.batch_size)
        self.store.counter_compact()  # the shards of connections that are gone, folded
        intents = 0
        for task in self.tasks:
            if task.keep_intents is not None:
                intents += self.store.intent_prune(
                    task.name, task.keep_intents, self.config.batch_size
                )
        return PrunerResult(jobs, intents)

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            result = self.run_once()
            return max(result.jobs, result.intents) >= self.config.batch_size

        run_forever("pruner", once, stop, self.config.interval.total_seconds())
