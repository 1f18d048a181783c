"""The consumer transaction: claim the key, run the handler, settle the job — all or nothing.

This module is the heart of the guarantee. For a batch of deliveries, one database transaction:

    BEGIN
      INSERT the batch's intents ... ON CONFLICT (key) DO NOTHING RETURNING key   -- the claim
      for each delivery, in order:
        key not returned  -> already claimed, by anyone, ever: settle `done/duplicate`
        key returned      -> run the handler on this same connection (a savepoint is opened
                             lazily, the first time it touches the connection)
                             ok     -> settle `done/completed`
                             raises -> its savepoint is rolled back, its intent deleted, and
                                       the job is settled `ready` (retry, backoff) or `dead`
      settle all jobs in one fenced UPDATE (WHERE lease_token = ours)              -- the ack
    COMMIT

Rules that batching must not weaken, and how they hold:
- a failed handler leaves no intent: its intent is deleted in the same transaction;
- one job's failure costs no other job an attempt: its savepoint isolates its writes, and the
  others still settle in the same commit;
- a superseded worker commits nothing: if the fenced settlement does not return every job, the
  whole transaction is rolled back, the lost jobs are recorded as superseded from outside it, and
  the jobs still ours are run again in a new transaction;
- a claim blocked by another live transaction on the same key (PostgreSQL, `lock_timeout`) does
  not fail the batch: the batch is redone one job per transaction, and only the blocked job is
  released, without spending its attempt, to be retried shortly;
- a batch the database refuses at the end (a deferred constraint at COMMIT, a trigger on the
  outbox) is redone one job per transaction too; the job whose own transaction is refused
  spends its attempt, the others complete;
- a transaction stops admitting handlers after `transaction_budget`, so slow handlers do not
  hold locks (and SQLite's write lock) for a whole batch; the rest run in the next transaction;
- a batch the store went away under (a restart, a lost connection) costs an attempt only to the
  job whose handler it cut off and to the jobs whose handler failed on their own: every other
  delivery of it — its handler never started, or completed in the transaction that never
  committed — is given back, its attempt restored, as soon as the store answers (fenced on its
  lease's token and attempt: a lease that ran out and was rescued or taken meanwhile is left
  alone). Until then the consumer keeps it; should its process die first, its lease runs out and
  the rescuer spends the attempt, as for any worker that dies.
"""

from __future__ import annotations

import logging
import random
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from oncebox.jobs import transitions
from oncebox.jobs.codec import check_finite, parse_args
from oncebox.jobs.tasks import Registry, Task
from oncebox.kernel import clock, points
from oncebox.kernel.errors import (
    ConnectionLost,
    HandlerTimeout,
    InvalidArguments,
    InvalidKey,
    StoreRefused,
    StoreUnavailable,
    TransactionControlRefused,
    TransactionEnded,
    UnknownTask,
)
from oncebox.kernel.logs import job_fields
from oncebox.kernel.metrics import Metrics
from oncebox.kernel.storable import storable_text
from oncebox.kernel.tracing import UNTRACED, Traced, process_span, recording
from oncebox.lanes.lane import run_forever
from oncebox.outbox.writer import OutboxWriter
from oncebox.queue.context import job_context
from oncebox.queue.handler_orm import Orm
from oncebox.queue.transport import Delivery, Settlement, Transport
from oncebox.queue.watch import HandlerWatch, Running
from oncebox.store.params import IntentClaim, OutboxInsert
from oncebox.store.protocol import ClaimLockTimeout, ConsumerSession, ConsumerTx

MAX_ERROR_CHARS = 8000
log = logging.getLogger("oncebox.consumer")


@dataclass(frozen=True)
class ConsumerConfig:
    """Consumer lane settings. `lease` is how long a batch is held between heartbeats.

    The lease size starts at `batch_size` and adapts (`LeaseSize`): while batches come back full
    and finish in one transaction well inside its budget — a deep backlog of quick handlers — it
    grows towards `max_batch_size` (default four times `batch_size`), since each batch pays a fixed
    cost (the lease, the claim, the commit: a few milliseconds) that a larger batch spreads
    thinner; when the budget cuts a batch short, it halves back towards `batch_size`. Set
    `max_batch_size=batch_size` for a fixed size.

    `poll_interval` paces `Consumer.run_forever` only: a worker's consumer lanes wait by
    `WorkerConfig.poll_interval`, and are woken sooner (`lanes/worker.py`)."""

    batch_size: int = 100
    max_batch_size: int | None = None
    # how long one consumer transaction keeps admitting handlers; None: the store's default
    # (PostgreSQL 500 ms; SQLite 100 ms, as its transaction holds the file's only write lock)
    transaction_budget: timedelta | None = None
    lease: timedelta = timedelta(seconds=30)
    lock_timeout: timedelta = timedelta(seconds=2)
    lock_retry_delay: timedelta = timedelta(seconds=1)
    poll_interval: timedelta = timedelta(seconds=5)

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= 10_000:
            raise ValueError("batch_size must be within 1..10000")
        if self.max_batch_size is not None and not (
            self.batch_size <= self.max_batch_size <= 10_000
        ):
            raise ValueError("max_batch_size must be within batch_size..10000")
        if self.lease <= timedelta(0) or self.lock_timeout <= timedelta(0):
            raise ValueError("lease and lock_timeout must be positive")
        if self.poll_interval <= timedelta(0):
            raise ValueError("poll_interval must be positive")


class LeaseSize:
    """How many deliveries the next lease asks for (see `ConsumerConfig`)."""

    GROW = 1.5  # per full, quick batch
    QUICK = 0.5  # "well inside the budget": this share of it

    def __init__(self, base: int, most: int, budget: float) -> None:
        self.base, self.most, self.budget = base, most, budget
        self.now = base

    def after(self, asked: int, leased: int, transactions: int, seconds: float) -> None:
        if transactions > 1:  # the budget cut it: too large for these handlers
            self.now = max(self.base, self.now // 2)
        elif leased >= asked and seconds < self.budget * self.QUICK:
            self.now = min(self.most, max(self.now + 1, int(self.now * self.GROW)))


@dataclass(frozen=True)
class FailedAttempt:
    """One failed attempt, as `oncebox.testing.drain` reports it."""

    task: str
    key: str | None
    job_id: int | None
    attempt: int
    error: str
    final: bool


@dataclass
class ConsumerResult:
    """Counts for one `run_once`."""

    leased: int = 0
    completed: int = 0
    duplicates: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    lease_lost: int = 0
    failures: list[FailedAttempt] = field(default_factory=list)
    settled_ids: set[str] = field(default_factory=set, repr=False)

    def add(self, other: ConsumerResult) -> None:
        for name in (
            "leased",
            "completed",
            "duplicates",
            "retried",
            "dead",
            "released",
            "lease_lost",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures.extend(other.failures)
        self.settled_ids |= other.settled_ids


@dataclass(slots=True)  # one per job
class _Prepared:
    """A delivery made ready to run: its task, decoded args and key, or why it cannot run."""

    delivery: Delivery
    task: Task | None = None
    args: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    problem: str | None = None


class _LeaseLost(Exception):
    def __init__(self, lost: list[Delivery]) -> None:
        super().__init__(f"{len(lost)} lease(s) superseded")
        self.lost = lost


class _BatchBroken(Exception):
    """A handler ended the transaction under us; the batch must be rolled back.

    It carries what the batch had decided before the culprit ran (`decided`: settlements with
    the outbox rows of the completed ones, and `outcome`, their counts) and the keys the batch
    itself claimed (`claimed`, key → delivery), so recovery can tell what really ran."""

    def __init__(self, culprit: _Prepared, error: TransactionControlRefused) -> None:
        super().__init__(str(error))
        self.culprit = culprit
        self.error = error
        self.decided: list[tuple[Settlement, list[OutboxInsert]]] = []
        self.outcome = ConsumerResult()
        self.claimed: dict[str, Delivery] = {}


def describe_error(error: BaseException) -> str:
    """The error as stored with the attempt: type, message and a short traceback."""
    lines = traceback.format_exception(type(error), error, error.__traceback__, limit=12)
    text = f"{type(error).__name__}: {error}\n" + "".join(lines[1:] if len(lines) > 1 else lines)
    return storable_text(text)[:MAX_ERROR_CHARS]


DRIFT_RETRY = timedelta(seconds=60)
DEFAULT_BUDGET = timedelta(milliseconds=500)
PACE_WEIGHT = 0.3  # of the latest batch in the moving average of time per job
# SQLite: other writers (the app's enqueues, the worker's own lease keeper) wait while a
# consumer transaction holds the file's write lock; a short budget keeps their wait short
# (docs/benchmarks.md, SQLite writer contention)
SQLITE_BUDGET = timedelta(milliseconds=100)


class Consumer:
    """One consumer lane: leases batches from a transport and runs consumer transactions."""

    def __init__(
        self,
        *,
        registry: Registry,
        session: ConsumerSession,
        transport: Transport,
        config: ConsumerConfig,
        metrics: Metrics,
        watch: HandlerWatch,
        now: Callable[[], datetime],
        rng: random.Random,
        worker: str,
        note_superseded: Callable[[Delivery, str], None],
        outbox: Callable[[str | None, int | None, datetime], OutboxWriter],
    ) -> None:
        self.registry = registry
        self.session = session
        self.transport = transport
        self.config = config
        self.metrics = metrics
        self.watch = watch
        self.now = now
        self.rng = rng
        self.worker = worker
        self.note_superseded = note_superseded
        self.outbox = outbox
        budget = config.transaction_budget
        if budget is None:
            budget = SQLITE_BUDGET if session.dialect == "sqlite" else DEFAULT_BUDGET
        self.budget = budget.total_seconds()
        most = config.max_batch_size or min(10_000, 4 * config.batch_size)
        self.size = LeaseSize(config.batch_size, most, self.budget)
        self._transactions = 0  # in the batch being run
        self._per_job: float | None = None  # seconds per job at this lane's pace (`slots`)
        self.outbox_written: Callable[[int], None] = lambda _count: None
        self.stopping: Callable[[], bool] = lambda: False
        # may this task mint keys now? (the key-drift guard; a delivery without a stored key has
        # its key rendered here, from today's template)
        self.may_render: Callable[[str], bool] = lambda _task: True
        # what handlers write through (`box.use_sqlalchemy()`, Django), None when not configured
        self.orm: Orm | None = None
        # does this task's job hold a concurrency limit's slot? (jobs/limits.py)
        self.holds_slot: Callable[[str], bool] = lambda _task: False
        # the batch's deliveries whose attempt counts though nothing of it commits: their handler
        # failed (or a refused transaction was theirs), or the store went away under it, and it
        # has not run again since (`_strand`)
        self._spent: set[str] = set()
        # what a store outage left of the last batch, to give back once the store answers
        self._stranded: list[Delivery] = []

    # -- the lane ------------------------------------------------------------------------------

    def run_once(self) -> ConsumerResult:
        """Lease one batch and run it to the end; returns what happened. What a store outage
        left of the last batch is given back first (`StoreUnavailable` while the store is still
        away: it is kept for the next call)."""
        result = ConsumerResult()
        self._recover(result)
        recovered = result.released
        asked = self.size.now
        deliveries = self.transport.fetch(asked)
        result.leased = len(deliveries)
        if not deliveries:
            points.reach("consumer.found_nothing")
            return result
        points.reach("consumer.leased")
        started, self._transactions = clock.monotonic(), 0
        self.process(deliveries, result)
        took = clock.monotonic() - started
        self.size.after(asked, len(deliveries), self._transactions, took)
        ran = len(deliveries) - (result.released - recovered)  # what was given back did not run
        if ran > 0:
            self._pace(took / ran)
        return result

    def run_forever(self, stop: threading.Event) -> None:
        """Rounds until `stop` is set, paced as a worker's consumer lane: the next at once after
        a round that leased, else after `poll_interval` (a worker's lane is also woken by new
        work and the next due job: `lanes/worker.py`, `_poll`). Once `stop` is set, the batch
        under way gives back, unspent, what it has not started."""
        stopping = self.stopping
        self.stopping = lambda: stop.is_set() or stopping()

        def once() -> bool:
            return self.run_once().leased > 0

        run_forever(
            f"consumer {self.worker}", once, stop, self.config.poll_interval.total_seconds()
        )

    def _pace(self, seconds: float) -> None:
        """Follow how long a job takes here (a moving average of its batches' time per job)."""
        was = self._per_job
        self._per_job = seconds if was is None else was + PACE_WEIGHT * (seconds - was)

    def slots(self) -> int:
        """How many jobs holding a concurrency limit's slot the next lease may take: as many as
        run within half the transaction budget at this lane's pace; one until that pace is
        known (`store/allocation.py`, `choose`)."""
        if self._per_job is None or self._per_job <= 0:
            return 1
        return max(1, min(self.size.most, int(self.budget * LeaseSize.QUICK / self._per_job)))

    def process(self, deliveries: Sequence[Delivery], result: ConsumerResult) -> None:
        pending = list(deliveries)
        self._spent = set()
        try:
            pending = self._refuse_drifted(pending, result)
            self._process(pending, result)
        except StoreUnavailable:
            # The database went away mid-batch (or ended a hung handler's session)
            self._strand([d for d in pending if d.message_id not in result.settled_ids], result)
            raise
        except BaseException:
            # Anything else that escaped (a bug, an interrupt): give the leases back if the store
            # answers, else let them expire and be rescued. Never heartbeat them forever.
            unsettled = [d for d in pending if d.message_id not in result.settled_ids]
            try:
                self.transport.release(unsettled, timedelta(0))
            except Exception:
                self.transport.drop(unsettled)
            raise

    def _strand(self, unsettled: list[Delivery], result: ConsumerResult) -> None:
        """After a store outage: the deliveries whose attempt counts — a handler that failed on
        its own, or that the outage cut off — are no longer heartbeated: their leases run out and
        the rescuer records the attempt, so a job whose handler hangs until the server ends its
        session still ends dead after its attempts. Every other one is given back, its attempt
        restored, now if the store answers already, else by the next `run_once`. Nothing of it
        committed: a settlement commits with its job's writes, and the give-back is fenced on the
        lease that settlement would have ended."""
        spent = [d for d in unsettled if d.message_id in self._spent]
        self.transport.drop(spent)
        self._stranded = [d for d in unsettled if d.message_id not in self._spent]
        try:
            self._recover(result)
        except StoreUnavailable:
            return  # still away

    def _recover(self, result: ConsumerResult) -> None:
        """Give back what a store outage left of the last batch; raises `StoreUnavailable`
        while the store is still away, keeping it for the next call."""
        if not self._stranded:
            return
        stranded = self._stranded
        self.transport.release(stranded, timedelta(0))
        self._stranded = []
        result.released += len(stranded)
        self.metrics.count("jobs_released", len(stranded))
        log.info(
            "%d job(s) of a batch a store outage interrupted given back unspent (each whose "
            "lease was still this consumer's)",
            len(stranded),
        )

    def close(self) -> None:
        """Give back what a store outage left stranded, if the store answers now (else those
        leases run out, and the rescuer spends their attempts), and close the session."""
        try:
            self._recover(ConsumerResult())
        except StoreUnavailable:
            log.warning("%d job(s) left to their leases: the store is away", len(self._stranded))
        finally:
            self.session.close()

    def _refuse_drifted(self, deliveries: list[Delivery], result: ConsumerResult) -> list[Delivery]:
        """Give back, without spending an attempt, deliveries whose key would be rendered by a
        task whose template drifted (see `oncebox.jobs.keyguard`)."""
        refused = [d for d in deliveries if d.key is None and not self.may_render(d.task)]
        if not refused:
            return deliveries
        self.transport.release(refused, DRIFT_RETRY)
        result.released += len(refused)
        self.metrics.count("jobs_released", len(refused))
        return [d for d in deliveries if d not in refused]

    def _process(self, pending: list[Delivery], result: ConsumerResult) -> None:
        while pending:
            if self.stopping():
                self.transport.release(pending, timedelta(0))
                result.released += len(pending)
                self.metrics.count("jobs_released", len(pending))
                return
            try:
                self._transactions += 1
                pending[:] = self._give_back_slots(self._transaction(pending, result), result)
            except (ClaimLockTimeout, StoreRefused) as exc:
                name = (
                    "claim_lock_timeouts"
                    if isinstance(exc, ClaimLockTimeout)
                    else "transactions_refused"
                )
                self.metrics.count(name)
                for delivery in list(pending):
                    self._single(delivery, result)
                return

    def _give_back_slots(self, left: list[Delivery], result: ConsumerResult) -> list[Delivery]:
        """What a transaction left of the batch (its budget ran out), minus the jobs holding a
        concurrency limit's slot: those are released at once, no attempt spent, so another
        lane can run them while this one goes on with the rest."""
        back = [d for d in left if self.holds_slot(d.task)]
        if not back:
            return left
        self.transport.release(back, timedelta(0))
        result.released += len(back)
        self.metrics.count("jobs_released", len(back))
        return [d for d in left if d not in back]

    def _single(self, delivery: Delivery, result: ConsumerResult) -> None:
        """Fallback after a lock timeout or a refused batch: one delivery per transaction, so
        that one job's blocked claim or refused writes cost no other job anything."""
        pending = [delivery]
        while pending:
            try:
                pending = self._transaction(pending, result)
            except ClaimLockTimeout:
                self.transport.release(pending, self.config.lock_retry_delay)
                result.released += len(pending)
                self.metrics.count("jobs_released", len(pending))
                return
            except StoreRefused as refused:
                self._refused(delivery, refused, result)
                return

    def _refused(self, delivery: Delivery, refused: StoreRefused, result: ConsumerResult) -> None:
        """The database refused this job's transaction on its own: the job caused it, so the
        attempt is spent (retried after its backoff, or dead at the end of its policy), in a
        transaction of its own. Should even that be refused, the lease is dropped: it expires,
        and the rescuer spends the attempt instead."""
        outcome = ConsumerResult()
        self._spent.add(delivery.message_id)
        p = self._prepare(delivery)
        if p.task is None or p.problem is not None:
            settlement = self._dead(p, p.problem or describe_error(refused), outcome)
        else:
            settlement = self._failed(p, refused, clock.monotonic(), outcome)
        try:
            with self.session.transaction() as tx:
                settled = self.transport.settle_in_transaction(tx, [settlement])
        except StoreRefused:
            log.exception(
                "job %s: its failed attempt could not be recorded",
                delivery.job_id,
                extra=job_fields(p.key, delivery.job_id, delivery.attempt, self.worker),
            )
            self.transport.drop([delivery])
            return
        if delivery.message_id in settled:
            self.transport.after_commit([settlement])
            outcome.settled_ids = settled
            result.add(outcome)
            self._count(outcome)
        else:
            self.transport.drop([delivery])

    # -- one transaction -----------------------------------------------------------------------

    def _transaction(self, pending: list[Delivery], result: ConsumerResult) -> list[Delivery]:
        """Run one consumer transaction over a prefix of `pending`; return what is left."""
        prepared = [self._prepare(d) for d in pending]
        points.reach("consumer.before_transaction")
        outcome = ConsumerResult()
        try:
            with self.session.transaction() as tx:
                settlements, leftover, messages = self._run_in(tx, prepared, outcome)
                tx.outbox_insert(messages)
                expected = {s.delivery.message_id for s in settlements}
                settled = self.transport.settle_in_transaction(tx, settlements)
                if settled != expected:
                    lost = [s.delivery for s in settlements if s.delivery.message_id not in settled]
                    raise _LeaseLost(lost)
                points.reach("consumer.after_handler_before_commit")
        except _LeaseLost as exc:
            return self._after_lease_lost(pending, exc.lost, result)
        except _BatchBroken as exc:
            return self._after_broken_batch(pending, exc, result)
        points.reach("consumer.committed")  # before the transport hears: a broker's lost ack
        self.transport.after_commit(settlements)
        outcome.settled_ids = expected  # every one of them: else the lease was lost
        if messages:
            self.outbox_written(len(messages))
        result.add(outcome)
        self._count(outcome)
        return leftover

    def _run_in(
        self, tx: ConsumerTx, prepared: list[_Prepared], outcome: ConsumerResult
    ) -> tuple[list[Settlement], list[Delivery], list[OutboxInsert]]:
        first_of_key: dict[str, _Prepared] = {}
        for p in prepared:
            if p.key is not None and p.problem is None:
                first_of_key.setdefault(p.key, p)
        # claimed in key order: concurrent batches with overlapping keys then wait on each
        # other instead of deadlocking
        claims = [
            IntentClaim(k, p.delivery.task, p.delivery.job_id)
            for k, p in sorted(first_of_key.items())
        ]
        claimed = tx.intent_claim(claims)
        points.reach("consumer.after_claim_insert")

        settlements: list[Settlement] = []
        unclaimed: list[str] = []
        leftover: list[Delivery] = []
        owners: dict[str, int | None] | None = None
        messages: list[OutboxInsert] = []
        decided: list[tuple[Settlement, list[OutboxInsert]]] = []  # in order, for recovery
        traced = recording()  # once per transaction: the handlers' spans, if anything records
        started = clock.monotonic()
        for index, p in enumerate(prepared):
            if index and clock.monotonic() - started > self.budget:
                leftover += [q.delivery for q in prepared[index:]]
                unclaimed += [
                    q.key
                    for q in prepared[index:]
                    if q.key in claimed and first_of_key.get(q.key) is q
                ]
                break
            if p.problem is not None:
                settlements.append(self._dead(p, p.problem, outcome))
            elif p.key is not None and first_of_key[p.key] is not p:
                leftover.append(p.delivery)  # same key twice in one batch: after this one
                continue
            elif p.key is not None and p.key not in claimed:
                if owners is None:
                    owners = tx.intent_owners([k for k in first_of_key if k not in claimed])
                settlements.append(self._unclaimed(p, owners, outcome))
            else:
                try:
                    settlement, written = self._run_handler(tx, p, outcome, traced)
                except _BatchBroken as broken:
                    broken.decided, broken.outcome = decided, outcome
                    broken.claimed = {k: first_of_key[k].delivery for k in claimed}
                    raise
                if settlement.outcome != "completed":
                    self._spent.add(p.delivery.message_id)  # it failed on its own
                    if p.key is not None:
                        unclaimed.append(p.key)
                settlements.append(settlement)
                decided.append((settlement, written))
                messages += written
                continue
            decided.append((settlements[-1], []))
        tx.intent_release(unclaimed)
        return settlements, leftover, messages

    def _unclaimed(
        self, p: _Prepared, owners: dict[str, int | None], outcome: ConsumerResult
    ) -> Settlement:
        """A delivery whose key was claimed before this transaction."""
        if p.delivery.job_id is not None and owners.get(p.key or "") == p.delivery.job_id:
            # this job's own claim committed earlier and its settlement did not (a broker's
            # acknowledgement lost after the commit): its handler ran and committed — done
            outcome.completed += 1
            return Settlement.of(p.delivery, transitions.completed())
        outcome.duplicates += 1
        return Settlement.of(p.delivery, transitions.duplicate())

    def _run_handler(
        self, tx: ConsumerTx, p: _Prepared, outcome: ConsumerResult, traced: bool = True
    ) -> tuple[Settlement, list[OutboxInsert]]:
        """Run one handler; its outbox rows count only if it succeeds. `traced`: whether a span
        would record (`tracing.recording`, asked once per transaction); when none would, no
        span's attributes and parent are built for the job."""
        if not traced:
            return self._run_traced(tx, p, outcome, UNTRACED)
        assert p.task is not None
        task, delivery = p.task, p.delivery
        with process_span(
            delivery.trace_context,
            queue=task.queue,
            task=task.name,
            job=delivery.message_id,
            key=p.key,
            attempt=delivery.attempt,
        ) as span:
            settlement, written = self._run_traced(tx, p, outcome, span)
            span.set(oncebox__state=settlement.state)  # done, ready (a retry) or dead
            return settlement, written

    def _run_traced(
        self, tx: ConsumerTx, p: _Prepared, outcome: ConsumerResult, traced: Traced
    ) -> tuple[Settlement, list[OutboxInsert]]:
        """The handler in its savepoint scope, marked for the watchdog. Written flat — this
        runs once per job, and each context manager entered or record built here costs about
        a microsecond: the watchdog's mark is set and cleared by calls, not a `with`."""
        task, delivery = p.task, p.delivery
        assert task is not None
        points.reach("consumer.before_handler")
        self._spent.discard(delivery.message_id)  # what it did before was undone: it runs again
        watch = self.watch
        limit = task.timeout.total_seconds()
        began = clock.monotonic()
        outbox = self.outbox(p.key, delivery.job_id, delivery.leased_at)
        try:
            with tx.handler_scope() as connection:
                orm = None if self.orm is None else self.orm.open(connection)
                ctx = job_context(
                    task.name,
                    self.session.dialect,
                    p.key,
                    delivery.job_id,
                    delivery.attempt,
                    connection,
                    outbox,
                    self.now,
                    orm,
                )
                marked = watch.begin(Running(task.name, p.key, began, limit, delivery.lease_token))
                try:
                    task.fn(ctx, **p.args)
                    if orm is not None:
                        orm.flush()  # inside the handler's savepoint; a failure fails the job
                finally:
                    watch.end(marked)
                    if orm is not None:
                        orm.close()
                elapsed = clock.monotonic() - began
                if elapsed > limit:
                    raise HandlerTimeout(
                        f"handler took {elapsed:.1f}s; the timeout of {task.name!r} is {limit:g}s"
                    )
        except TransactionEnded as error:
            raise _BatchBroken(p, error) from None
        except ConnectionLost:
            self._spent.add(delivery.message_id)  # cut off: its handler ran
            raise
        except Exception as error:
            traced.failed(error)
            return self._failed(p, error, began, outcome), []
        outcome.completed += 1
        return Settlement.of(delivery, transitions.completed()), outbox.rows

    def _failed(
        self, p: _Prepared, error: BaseException, began: float, outcome: ConsumerResult
    ) -> Settlement:
        assert p.task is not None
        delivery = p.delivery
        decision = p.task.retry.decide(error, delivery.attempt, delivery.attempts_left, self.rng)
        text = describe_error(error)
        retry = decision.retry
        if retry and delivery.expires_at is not None:
            estimate = delivery.leased_at + timedelta(seconds=clock.monotonic() - began)
            if estimate + decision.delay >= delivery.expires_at:
                retry = False
                text = f"max age reached ({delivery.expires_at.isoformat()}); {text}"
        if not retry and decision.reason:
            text = f"{text}\n(final: {decision.reason})"
        outcome.failures.append(
            FailedAttempt(delivery.task, p.key, delivery.job_id, delivery.attempt, text, not retry)
        )
        if retry:
            outcome.retried += 1
            return Settlement.of(delivery, transitions.retry(decision.delay, text))
        outcome.dead += 1
        return Settlement.of(delivery, transitions.dead(text))

    def _dead(self, p: _Prepared, problem: str, outcome: ConsumerResult) -> Settlement:
        d = p.delivery
        outcome.dead += 1
        outcome.failures.append(FailedAttempt(d.task, p.key, d.job_id, d.attempt, problem, True))
        return Settlement.of(d, transitions.dead(problem))

    def _prepare(self, delivery: Delivery) -> _Prepared:
        """Decode and check a delivery before the transaction; problems are permanent.

        Preparing reads only the delivery and the registry, so whatever fails here would fail
        the same way on every attempt: the delivery is settled dead with its problem named, and
        the rest of the batch runs. Nothing may escape: an exception here would release the
        whole batch unsettled, and the broker would hand the same poison back forever.
        The arguments' types are checked before their numbers' finiteness, so ``{"n": 1e400}``
        for an ``n: int`` names the parameter and its type."""
        task: Task | None = None
        args: dict[str, Any] = {}
        try:
            task = self.registry.get(delivery.task)
            args = parse_args(delivery.args_json)
            task.check_args(args)
            check_finite(args)
            key = delivery.key if delivery.key is not None else task.render_key(args)
            return _Prepared(delivery, task, args, key)
        except (UnknownTask, InvalidArguments, InvalidKey) as exc:
            problem = f"{type(exc).__name__}: {exc} (permanent: not retried)"
        except (ValueError, RecursionError) as exc:
            problem = (
                f"InvalidArguments: stored arguments cannot be read: {type(exc).__name__}: "
                f"{str(exc)[:200]} (permanent: not retried)"
            )
        except Exception as exc:  # a bug; a retry would meet it again
            problem = (
                f"could not prepare the delivery (permanent: not retried): {describe_error(exc)}"
            )
        return _Prepared(delivery, task, args, None, problem)

    # -- after a rollback ----------------------------------------------------------------------

    def _after_lease_lost(
        self, pending: list[Delivery], lost: list[Delivery], result: ConsumerResult
    ) -> list[Delivery]:
        points.reach("consumer.lease_lost")
        result.lease_lost += len(lost)
        self.metrics.count("leases_lost", len(lost))
        self.transport.drop(lost)
        for delivery in lost:
            self.note_superseded(
                delivery,
                f"commit refused: {self.worker} finished attempt {delivery.attempt} after its "
                "lease had been superseded; its transaction was rolled back",
            )
        gone = {d.message_id for d in lost}
        return [d for d in pending if d.message_id not in gone]

    def _after_broken_batch(
        self, pending: list[Delivery], exc: _BatchBroken, result: ConsumerResult
    ) -> list[Delivery]:
        """The claim's transaction ended under a handler: a COMMIT the guard could not see, or a
        rollback. The batch's own claims tell which: they were inserted before any handler ran.

        - Rolled back (no claim of the batch survived): nothing of the batch happened. The
          culprit is dead; every other delivery runs again.
        - Committed: the claims, and the writes of the handlers that ran before the culprit,
          are in the database. What was decided before the culprit stands — completed jobs
          settle `completed` and their buffered outbox rows are written now, failed ones keep
          their failure — and the culprit is dead. A claim whose handler never ran (it came
          after the culprit) or failed is deleted, so that its job runs again and is never
          settled as done on the strength of a claim alone.
        """
        culprit = exc.culprit
        outcome = ConsumerResult()
        self._spent.add(culprit.delivery.message_id)
        dead = self._dead(culprit, describe_error(exc.error), outcome)
        with self.session.transaction() as tx:
            owners = tx.intent_owners(sorted(exc.claimed)) if exc.claimed else {}
            committed = any(
                key in owners and owners[key] == delivery.job_id
                for key, delivery in exc.claimed.items()
            )
            settlements = [dead]
            if committed:
                settlements += [settlement for settlement, _rows in exc.decided]
                tx.outbox_insert([row for _s, rows in exc.decided for row in rows])
                completed = {s.delivery.message_id for s in settlements if s.outcome == "completed"}
                tx.intent_release(
                    sorted(k for k, d in exc.claimed.items() if d.message_id not in completed)
                )
                outcome.add(exc.outcome)
            settled = self.transport.settle_in_transaction(tx, settlements)
        self.transport.after_commit([s for s in settlements if s.delivery.message_id in settled])
        lost = [s.delivery for s in settlements if s.delivery.message_id not in settled]
        if lost:  # taken over meanwhile: the new owner settles them (a committed claim of the
            self.transport.drop(lost)  # job's own counts as completed; others run again)
        outcome.settled_ids = settled
        result.add(outcome)
        self._count(outcome)
        log.error(
            "job %s (%s): %s",
            culprit.delivery.job_id,
            culprit.key,
            describe_error(exc.error),
            extra=job_fields(
                culprit.key, culprit.delivery.job_id, culprit.delivery.attempt, self.worker
            ),
        )
        done = {s.delivery.message_id for s in settlements}
        return [d for d in pending if d.message_id not in done]

    def _count(self, outcome: ConsumerResult) -> None:
        for failed in outcome.failures:  # committed: what the operator's log should show
            log.warning(
                "job %s (%s) of task %s failed attempt %d; %s: %s",
                failed.job_id,
                failed.key or "no key",
                failed.task,
                failed.attempt,
                "dead" if failed.final else "to be retried",
                (failed.error.splitlines() or [""])[0][:300],  # all of it: jobs show KEY
                extra=job_fields(failed.key, failed.job_id, failed.attempt, self.worker),
            )
        self.metrics.count("jobs_completed", outcome.completed)
        self.metrics.count("claim_conflicts", outcome.duplicates)
        self.metrics.count("jobs_retried", outcome.retried)
        self.metrics.count("jobs_dead", outcome.dead)
