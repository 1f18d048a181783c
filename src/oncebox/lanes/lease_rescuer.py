"""`LeaseRescuer`: jobs whose lease expired go back to `ready` (or `dead`), attempt recorded.

A lease expires when its worker died, froze or lost the database for longer than the lease. The
attempt it was making counts (a poison job that kills its worker is dead after `max_attempts`
crashes, not retried forever) and is recorded as `lease_expired` with the worker's name. The
worker, if it still lives, cannot commit: its settlement is fenced on the token the rescue cleared,
and so is its give-back of the jobs a store outage kept it from running (lanes/consumer.py): a
worker that outlives the outage gives those back itself, unspent, if the store answers first.
Every worker runs a rescuer; `SKIP LOCKED` keeps them from stepping on each other.

It also hands back to the unlimited lease the ready jobs of tasks declared without limits that
still carry a partition (enqueued while the task was limited): the unlimited lease takes only
jobs without one, so they would otherwise wait for ever — once no process has declared the task
limited for `LAPSE`, so that a worker of the release before one that adds a limit leaves that
release's jobs limited (`jobs/declarations.py`). And it hands to the relay the ready jobs of
the broker-held queues its worker serves (a dead letter replayed, a job enqueued by a process
that did not know the queue's broker, a queue moved onto a broker with work waiting): no table
lane serves such a queue, so they too would wait for ever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from oncebox.jobs.declarations import LAPSE
from oncebox.kernel.metrics import Metrics
from oncebox.lanes.delivery_rescuer import DeliveryRescuer
from oncebox.lanes.lane import run_forever
from oncebox.store.protocol import Store
from oncebox.store.records import RescuedJob

log = logging.getLogger("oncebox.rescuer")


@dataclass(frozen=True)
class LeaseRescuerConfig:
    interval: timedelta = timedelta(seconds=15)
    batch_size: int = 500


@dataclass(frozen=True)
class LeaseRescuerResult:
    rescued: list[RescuedJob]

    @property
    def ready(self) -> int:
        return sum(1 for job in self.rescued if job.state == "ready")

    @property
    def dead(self) -> int:
        return sum(1 for job in self.rescued if job.state == "dead")


class LeaseRescuer:
    """Expired job leases; with `deliveries`, expired outbox leases too, in the same round."""

    def __init__(
        self,
        store: Store,
        config: LeaseRescuerConfig,
        metrics: Metrics,
        deliveries: DeliveryRescuer | None = None,
        *,
        unlimited: Sequence[str] = (),
        brokered: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self.deliveries = deliveries
        self.unlimited = list(unlimited)  # the tasks this worker knows, declared without limits
        # the broker-held queues this worker serves, with their tasks (PostgreSQL: 0016)
        self.brokered = dict(brokered or {})

    def run_once(self) -> LeaseRescuerResult:
        if self.deliveries is not None and self.deliveries.channels:
            self.deliveries.run_once()
        if self.unlimited:
            freed = self.store.job_unlimit(self.unlimited, self.config.batch_size, LAPSE)
            if freed:
                log.warning(
                    "%s ready job(s) carried a partition of limits no process has declared "
                    "for %d minutes: leased without limits now",
                    freed,
                    LAPSE // timedelta(minutes=1),
                )
        if self.brokered:
            tasks = sorted({task for names in self.brokered.values() for task in names})
            adopted = self.store.job_relay_adopt(
                sorted(self.brokered), tasks, self.config.batch_size
            )
            if adopted:
                log.info("%s ready job(s) of broker-held queues handed to the relay", adopted)
        result = LeaseRescuerResult(self.store.job_rescue_expired(self.config.batch_size))
        for job in result.rescued:
            log.warning(
                "lease of job %s (task %s, key %s, attempt %s) held by %s expired; now %s",
                job.id,
                job.task,
                job.key,
                job.attempt,
                job.worker,
                job.state,
            )
        self.metrics.count("leases_expired", len(result.rescued))
        self.metrics.count("jobs_dead", result.dead)
        return result

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            return len(self.run_once().rescued) >= self.config.batch_size

        run_forever("lease rescuer", once, stop, self.config.interval.total_seconds())
