"""The seam between a queue and the consumer: deliveries in, settlements out.

The consumer does not know its transport. A transport hands it `Delivery`s (task, args, key,
attempt) and is told how each ended (`Settlement`). The built-in table queue (`TableTransport`)
settles *inside* the consumer transaction — its acknowledgement is the fenced update of the job
row, committed with the claim — so it rarely produces a claim conflict. A broker transport can only
acknowledge after the commit; when an acknowledgement is lost the broker redelivers, and then the
intent row is what absorbs the duplicate (counted as a claim conflict).
`oncebox.testing.RedeliveringTransport` behaves like such a broker.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Protocol

from oncebox.jobs.transitions import JobTransition
from oncebox.store.params import JobFinish, JobLeaseParams, JobReleaseParams, LimitPlan
from oncebox.store.protocol import ConsumerSession, ConsumerTx
from oncebox.store.records import DueTime, Outcome

SettleState = Literal["done", "ready", "dead"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a message to this consumer.

    `key` is the key stored with the job (table queue: rendered once at enqueue, never again) or
    None, in which case the consumer renders it from the args with the task's template (brokers).
    `attempts_left` is how many attempts may follow this one.
    """

    message_id: str
    task: str
    args_json: str
    key: str | None
    attempt: int
    attempts_left: int
    leased_at: datetime
    expires_at: datetime | None = None
    job_id: int | None = None
    lease_token: str | None = None
    trace_context: str | None = None  # where its enqueue's trace continues (oncebox.kernel.tracing)


_new, _set = object.__new__, object.__setattr__


def leased_delivery(  # noqa: PLR0917 (positional on purpose: one call per job)
    message_id: str,
    task: str,
    args_json: str,
    key: str | None,
    attempt: int,
    attempts_left: int,
    leased_at: datetime,
    expires_at: datetime | None,
    job_id: int | None,
    lease_token: str | None,
    trace_context: str | None,
) -> Delivery:
    """`Delivery(...)` with every field given, for a lease's rows (one call per job): a frozen
    dataclass's `__init__` sets each field through `object.__setattr__`, looked up anew per
    field; here the same calls run with the lookup done once — about half the time for its
    eleven fields. A test pins it to the constructor, field by field."""
    d = _new(Delivery)
    _set(d, "message_id", message_id)
    _set(d, "task", task)
    _set(d, "args_json", args_json)
    _set(d, "key", key)
    _set(d, "attempt", attempt)
    _set(d, "attempts_left", attempts_left)
    _set(d, "leased_at", leased_at)
    _set(d, "expires_at", expires_at)
    _set(d, "job_id", job_id)
    _set(d, "lease_token", lease_token)
    _set(d, "trace_context", trace_context)
    return d


@dataclass(slots=True)  # per job: see `oncebox.store.records.LeasedJob`
class Settlement:
    """How a delivery ended: one of the named transitions of `oncebox.jobs.transitions`, built
    with `of`, so that the states, outcomes and delays the consumer settles with are the ones
    the state table names."""

    delivery: Delivery
    state: SettleState
    outcome: Outcome | None = None
    delay: timedelta = timedelta(0)
    error: str | None = None

    @classmethod
    def of(cls, delivery: Delivery, transition: JobTransition) -> Settlement:
        return cls(
            delivery, transition.state, transition.outcome, transition.delay, transition.error
        )


class Transport(Protocol):
    def fetch(self, limit: int) -> list[Delivery]:
        """Up to `limit` deliveries, leased to this consumer; empty when nothing is due."""
        ...

    def settle_in_transaction(self, tx: ConsumerTx, settlements: Sequence[Settlement]) -> set[str]:
        """Record settlements inside the consumer transaction; return the message ids that were
        still this consumer's to settle. Any other id means the lease was superseded, and the
        consumer rolls the whole transaction back."""
        ...

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        """Acknowledge (or negatively acknowledge) after the transaction committed."""
        ...

    def release(self, deliveries: Sequence[Delivery], delay: timedelta) -> None:
        """Give deliveries back unprocessed, without spending their attempt."""
        ...

    def drop(self, deliveries: Sequence[Delivery]) -> None:
        """Forget deliveries whose lease was superseded (someone else owns them now)."""
        ...

    def held_tokens(self) -> list[str]:
        """Lease tokens this transport currently holds (for heartbeats)."""
        ...

    def next_due_in(self) -> float | None:
        """Seconds until the next delivery may become available (0 or less: now), if the
        transport knows; by the store's clock."""
        ...

    def can_probe(self) -> bool:
        """Whether `next_due_in` is a fresh look at everything `fetch` could return — then an
        idle lane's fallback poll asks it first and fetches only when something is due, one
        statement instead of a lease's transaction. A broker cannot be looked at without a
        fetch: False."""
        ...


class TableTransport:
    """The built-in queue: the jobs table of the store, leased in batches under one token."""

    def __init__(
        self,
        session: ConsumerSession,
        *,
        tasks: Sequence[str],
        queues: Sequence[str],
        worker: str,
        lease_for: timedelta,
        next_due: NextDue,
        allowed: Callable[[Sequence[str]], list[str]] | None = None,
        limits: LimitPlan | None = None,
    ) -> None:
        self._session = session
        self._limits = limits or None  # the limited tasks' (limits/): leased through them
        # how many jobs holding a slot a lease may take (the consumer's pace: `Consumer.slots`)
        self.slots: Callable[[], int | None] = lambda: None
        self._tasks = list(tasks)
        # which of the tasks may run now (the key-drift guard leaves drifted ones out)
        self._allowed = allowed or list
        self._queues = list(queues)
        self._worker = worker
        self._lease_for = lease_for
        self._next_due = next_due
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def fetch(self, limit: int) -> list[Delivery]:
        token = str(uuid.uuid4())
        jobs = self._session.job_lease(
            JobLeaseParams(
                tasks=self._allowed(self._tasks),
                queues=self._queues,
                limit=limit,
                worker=self._worker,
                token=token,
                lease_for=self._lease_for,
                limits=self._limits,
                slots=self.slots() if self._limits else None,
            )
        )
        if jobs:
            with self._lock:
                self._held[token] = len(jobs)
        return [
            leased_delivery(
                str(job.id),  # message_id
                job.task,
                job.args_json,
                job.key,
                job.attempt,
                job.max_attempts - (job.attempt - job.attempt_base),  # attempts_left
                job.leased_at,
                job.expires_at,
                job.id,  # job_id
                token,  # lease_token
                job.trace_context,
            )
            for job in jobs
        ]

    def _forget(self, token: str, count: int) -> None:
        with self._lock:
            left = self._held.get(token, 0) - count
            if left > 0:
                self._held[token] = left
            else:
                self._held.pop(token, None)

    def settle_in_transaction(self, tx: ConsumerTx, settlements: Sequence[Settlement]) -> set[str]:
        by_token: dict[str, list[Settlement]] = {}
        for settlement in settlements:
            token = settlement.delivery.lease_token
            assert token is not None and settlement.delivery.job_id is not None
            by_token.setdefault(token, []).append(settlement)
        settled: set[str] = set()
        for token, group in by_token.items():
            finishes = [
                JobFinish(s.delivery.job_id or 0, s.state, s.outcome, s.delay, s.error)
                for s in group
            ]
            settled.update(map(str, tx.job_finish(token, finishes)))
        return settled

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        settled: dict[str, int] = {}  # per lease: a batch is one, or a few after a recovery
        for settlement in settlements:
            token = settlement.delivery.lease_token
            if token is not None:
                settled[token] = settled.get(token, 0) + 1
        for token, count in settled.items():
            self._forget(token, count)

    def release(self, deliveries: Sequence[Delivery], delay: timedelta) -> None:
        """Fenced on each lease's token and the attempt it took: a job whose lease ran out
        meanwhile (rescued, perhaps leased by another consumer) is left as it is."""
        by_token: dict[str, list[tuple[int, int]]] = {}
        for delivery in deliveries:
            assert delivery.lease_token is not None and delivery.job_id is not None
            job = (delivery.job_id, delivery.attempt)
            by_token.setdefault(delivery.lease_token, []).append(job)
        for token, jobs in by_token.items():
            self._session.job_release(JobReleaseParams(jobs=jobs, token=token, delay=delay))
            self._forget(token, len(jobs))

    def drop(self, deliveries: Sequence[Delivery]) -> None:
        """Stop heartbeating deliveries whose lease was superseded."""
        for delivery in deliveries:
            if delivery.lease_token is not None:
                self._forget(delivery.lease_token, 1)

    def held_tokens(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def next_due_in(self) -> float | None:
        due = self._session.due_seen() or self._next_due(self._allowed(self._tasks), self._queues)
        return due.seconds()

    def can_probe(self) -> bool:
        """The probe reads the ready jobs of the same tasks and queues the lease takes, by the
        same clock: when it finds none due, a lease would have found none either."""
        return True


class NextDue(Protocol):
    def __call__(self, tasks: Sequence[str], queues: Sequence[str]) -> DueTime: ...
