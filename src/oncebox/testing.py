"""Helpers for users' tests, built on the real code paths (the real store, the real consumer).

    from oncebox.testing import drain, assert_enqueued, FrozenClock

    box.enqueue(weekly_digest, customer_id=42, period="2026-W33")
    assert_enqueued(box, key="weekly-digest/customer-42/2026-W33")
    result = drain(box)                    # runs due jobs until none is left; raises on failures
    assert result.completed == 1

    with FrozenClock(box, at=datetime(2026, 8, 17, 9, tzinfo=UTC)) as frozen:
        ...
        frozen.advance(timedelta(hours=1))  # every process of the test sees the new time

`RedeliveringTransport` is a stand-in for a broker that delivers at least once — twice, late,
out of order, to several consumers at once — for exercising the claim-conflict path.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from oncebox.box import Box
from oncebox.jobs.codec import DEFAULT_MAX_PAYLOAD_BYTES, encode_args
from oncebox.kernel import clock
from oncebox.kernel.clock import EPOCH, ClockLease
from oncebox.kernel.counters import settlement_counts
from oncebox.kernel.errors import DrainFailed
from oncebox.lanes.assembly import build_lease_rescuer
from oncebox.lanes.consumer import ConsumerResult, FailedAttempt
from oncebox.lanes.dispatcher import DispatcherResult
from oncebox.lanes.lease_rescuer import LeaseRescuerConfig
from oncebox.providers import Capabilities, Outgoing, Receipt
from oncebox.queue.transport import Delivery, Settlement
from oncebox.store.protocol import ConsumerTx
from oncebox.store.records import JobRow


@dataclass
class DrainResult(ConsumerResult):
    rounds: int = 0
    dispatched: DispatcherResult = field(default_factory=DispatcherResult)


def drain(
    box: Box, *, raise_on_failure: bool = True, dispatch: bool = True, max_rounds: int = 10_000
) -> DrainResult:
    """Run every due job through the real consumer, then (with `dispatch`) every due outbox row
    through the real dispatcher, until nothing due is left.

    Jobs and messages retried with a delay in the future are not due and stay queued (advance the
    frozen clock to run them). Raises `DrainFailed`, listing each failed job attempt and counting
    dead or ambiguous deliveries, if anything failed.
    """
    result = DrainResult()
    box.runtime.limit_declarations.declare_all()  # as a worker starting
    build_lease_rescuer(box.runtime, LeaseRescuerConfig(), box.channels).run_once()
    consumer = box.consumer()
    dispatcher = box.dispatcher() if dispatch else None
    try:
        while result.rounds < max_rounds:
            round_result = consumer.run_once()
            result.rounds += 1
            result.add(round_result)
            sent = dispatcher.run_once() if dispatcher is not None else None
            if sent is not None:
                result.dispatched.add(sent)
            if not round_result.leased and (sent is None or not sent.leased):
                break
    finally:
        consumer.session.close()
    problems = result.dispatched.dead + result.dispatched.ambiguous
    if raise_on_failure and (result.failures or problems):
        raise DrainFailed(_describe_failures(result.failures, result.dispatched))
    return result


def outbox_sent(box: Box, key: str) -> list[dict[str, Any]]:
    """The payloads of the sent outbox rows of a key (its own, or its intent's) — those whose
    content retention has not dropped yet."""
    return [
        json.loads(row.payload_json)
        for row in box.store.outbox_find_by_key(key)
        if row.state == "sent" and row.payload_dropped_at is None
    ]


class MemoryProvider:
    """A provider for users' tests: keeps what it was sent, deduplicates by idempotency key like
    an idempotent API would — within its window (24 hours by default, on the real clock, like
    the API it stands for; `window=None` remembers for ever) — and can be told to fail the next
    sends. A resend after the window is delivered again: `deliveries` shows the duplicate."""

    name = "memory"
    idempotent = True
    capabilities = Capabilities()

    def __init__(
        self,
        window: timedelta | None = timedelta(hours=24),
        now: Callable[[], float] = clock.monotonic,
    ) -> None:
        self.idempotency_window = window
        self.sent: dict[str, Outgoing] = {}  # the first delivery of each remembered key
        self.deliveries: list[Outgoing] = []  # every delivery, duplicates included
        self.failures: list[Exception] = []
        self._first: dict[str, tuple[float, Receipt]] = {}  # key -> when, and the reply
        self._now = now
        self._lock = threading.Lock()

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        with self._lock:
            if self.failures:
                raise self.failures.pop(0)
            first = self._first.get(idempotency_key)
            window = self.idempotency_window
            if first is not None and (
                window is None or self._now() - first[0] < window.total_seconds()
            ):
                return first[1]  # the first reply, replayed
            self.sent.setdefault(idempotency_key, outgoing)
            self.deliveries.append(outgoing)
            receipt = Receipt(f"memory-{len(self.deliveries)}")
            self._first[idempotency_key] = (self._now(), receipt)
            return receipt

    def messages(self) -> list[dict[str, Any]]:
        """Every message delivered, in order (a duplicate past the window appears twice)."""
        with self._lock:
            return [outgoing.payload for outgoing in self.deliveries]


def _describe_failures(
    failures: Sequence[FailedAttempt], dispatched: DispatcherResult | None = None
) -> str:
    lines = [f"{len(failures)} attempt(s) failed:"]
    if dispatched is not None and (dispatched.dead or dispatched.ambiguous):
        lines.append(f"  deliveries: {dispatched.dead} dead, {dispatched.ambiguous} ambiguous")
    for failure in failures:
        first_line = failure.error.splitlines()[0] if failure.error else ""
        lines.append(
            f"  - task {failure.task} key {failure.key} job {failure.job_id} attempt "
            f"{failure.attempt}{' (final)' if failure.final else ''}: {first_line}"
        )
    return "\n".join(lines)


def enqueued(box: Box, *, key: str, task: str | None = None) -> JobRow | None:
    """The ready, leased or relayed job with this key (and task), if any."""
    for job in box.store.job_find_by_key(key):
        if job.state in ("ready", "leased", "relayed") and (task is None or job.task == task):
            return job
    return None


def assert_enqueued(box: Box, *, key: str, task: str | None = None) -> JobRow:
    job = enqueued(box, key=key, task=task)
    if job is None:
        found = [(j.id, j.task, j.state) for j in box.store.job_find_by_key(key)]
        raise AssertionError(f"no ready job with key {key!r}; jobs with that key: {found}")
    return job


def refute_enqueued(box: Box, *, key: str, task: str | None = None) -> None:
    job = enqueued(box, key=key, task=task)
    if job is not None:
        raise AssertionError(f"job {job.id} ({job.task}, {job.state}) is enqueued with key {key!r}")


class FrozenClock:
    """Freeze `oncebox_now()` for every process using this database; restores real time on exit.

    The setting is held through a `ClockLease`: it names this process as its owner and lapses
    by itself shortly after this process dies (`ONCEBOX_CLOCK_LEASE`, 30 s by default), so a
    test killed half-way cannot leave the database on frozen time. Workers in this process run
    on it; a worker in another process refuses it unless it opts in (`simulated_time=True`)."""

    def __init__(self, box: Box, at: datetime, lease: timedelta | None = None) -> None:
        self.box = box
        self.instant = at
        self._lease = ClockLease(box.store, lease)
        self._lease.set(frozen_at=at)

    def set(self, instant: datetime) -> None:
        self.instant = instant
        self._lease.set(frozen_at=instant)

    def advance(self, delta: timedelta) -> datetime:
        self.set(self.instant + delta)
        return self.instant

    def release(self) -> None:
        self._lease.release()

    def __enter__(self) -> FrozenClock:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.release()


@dataclass
class _Message:
    message_id: str
    task: str
    args_json: str
    receives: int = 0
    acked: bool = False


@dataclass
class RedeliveringTransport:
    """An at-least-once broker in memory, thread-safe.

    Every published message is put in the queue `copies` times (so it is delivered that many
    times, possibly to different consumers at once), the queue is shuffled (out of order), and a
    message that was not acknowledged — a failed attempt, a released delivery — is delivered
    again. Acknowledgement happens after the consumer's commit, like any broker.
    """

    copies: int = 2
    max_receives: int = 5
    seed: int = 0
    acks: list[tuple[str, str]] = field(default_factory=list)
    _messages: dict[str, _Message] = field(default_factory=dict)
    _ready: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counter: int = 0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def publish(self, task: str, **args: Any) -> str:
        with self._lock:
            self._counter += 1
            message = _Message(
                f"m{self._counter}", task, encode_args(args, task, DEFAULT_MAX_PAYLOAD_BYTES)
            )
            self._messages[message.message_id] = message
            self._ready.extend([message.message_id] * self.copies)
            self._rng.shuffle(self._ready)
            return message.message_id

    def fetch(self, limit: int) -> list[Delivery]:
        deliveries: list[Delivery] = []
        with self._lock:
            while self._ready and len(deliveries) < limit:
                message = self._messages[self._ready.pop()]
                message.receives += 1
                self._counter += 1
                deliveries.append(
                    Delivery(
                        message_id=f"{message.message_id}#{self._counter}",
                        task=message.task,
                        args_json=message.args_json,
                        key=None,
                        attempt=message.receives,
                        attempts_left=self.max_receives - message.receives,
                        leased_at=EPOCH,
                    )
                )
        return deliveries

    def settle_in_transaction(self, tx: ConsumerTx, settlements: Sequence[Settlement]) -> set[str]:
        """A broker's deliveries have no job rows to settle: they are counted here, in the
        consumer's transaction, as the table queue's settlement counts its own."""
        tx.counter_add(settlement_counts((s.state, s.outcome) for s in settlements))
        return {s.delivery.message_id for s in settlements}

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        with self._lock:
            for settlement in settlements:
                message_id = settlement.delivery.message_id.split("#", 1)[0]
                if settlement.state == "ready":
                    self._ready.insert(0, message_id)
                    continue
                self._messages[message_id].acked = True
                self.acks.append((message_id, settlement.outcome or settlement.state))

    def release(self, deliveries: Sequence[Delivery], delay: timedelta) -> None:
        with self._lock:
            for delivery in deliveries:
                self._ready.insert(0, delivery.message_id.split("#", 1)[0])

    def drop(self, deliveries: Sequence[Delivery]) -> None:
        """Nothing to forget: a broker has no lease tokens here."""

    def held_tokens(self) -> list[str]:
        return []

    def next_due_in(self) -> float | None:
        return None

    def can_probe(self) -> bool:
        return False

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._ready)


__all__ = [
    "DrainResult",
    "FrozenClock",
    "MemoryProvider",
    "RedeliveringTransport",
    "assert_enqueued",
    "drain",
    "enqueued",
    "outbox_sent",
    "refute_enqueued",
]
