"""A store outage in the middle of a consumer's batch spends no attempt on the jobs it did not
run: the deliveries whose handler never started, or ran in the transaction that never
committed, are given back — attempt restored, lease released, fenced on the lease token and the
attempt — as soon as the store answers, by the consumer holding them. Only the job whose handler
the outage cut off, and one whose handler failed on its own, keep their attempt spent: their
leases run out and the rescuer records it, as when a worker dies."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from oncebox import Box
from oncebox.chaos.mutations import mutated
from oncebox.chaos.private_server import PrivateServer, private_server
from oncebox.kernel import points
from oncebox.kernel.errors import StoreUnavailable
from oncebox.lanes.assembly import build_consumer
from oncebox.lanes.consumer import Consumer, ConsumerConfig
from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.queue.watch import HandlerWatch
from oncebox.store import open_store
from oncebox.testing import FrozenClock, drain
from support.faults import Outage
from support.rows import job_attempts, job_row

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


class Runs:
    """How often each job's handler ran, and the most runs of one job at the same time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: Counter[int] = Counter()
        self.total: Counter[int] = Counter()
        self.most_at_once = 0

    @contextmanager
    def one(self, n: int) -> Iterator[None]:
        with self._lock:
            self._now[n] += 1
            self.total[n] += 1
            self.most_at_once = max(self.most_at_once, self._now[n])
        try:
            yield
        finally:
            with self._lock:
                self._now[n] -= 1


@dataclass(frozen=True)
class Outcome:
    given_back: int  # by the consumer's first round once the store answered
    attempts: dict[int, int]  # each job's attempt count once everything ran
    spent: dict[int, list[str]]  # the jobs with recorded attempts: their outcomes
    most_at_once: int


def _settle(
    box: Box, clock: FrozenClock, ids: dict[int, int | None], runs: Runs, given_back: int
) -> Outcome:
    """Past every lease still held, the rescuer's round, then everything run: what it cost."""
    deadlines = [job_row(box, i).lease_expires_at for i in ids.values()]
    clock.set(max((d for d in deadlines if d is not None), default=T0) + timedelta(seconds=1))
    drain(box)  # its rescuer first, then every job due
    assert all(job_row(box, i).state == "done" for i in ids.values())
    spent = {n: [a.outcome for a in job_attempts(box, i)] for n, i in ids.items()}
    return Outcome(
        given_back,
        {n: job_row(box, i).attempt for n, i in ids.items()},
        {n: outcomes for n, outcomes in spent.items() if outcomes},
        runs.most_at_once,
    )


def _outage_consumer(box: Box, name: str) -> tuple[Consumer, Outage]:
    """A consumer whose session and transactions fail while its `Outage` is on."""
    outage = Outage(box.store)
    runtime = replace(box.runtime, store=outage)
    watch = HandlerWatch(exit_on_hang=False)
    consumer, _transport = build_consumer(runtime, ConsumerConfig(), watch, name=name)
    return consumer, outage


def _in_thread(call: Callable[[], Any]) -> Callable[[], BaseException | None]:
    """Start `call` in a thread; the returned function joins it and returns what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, name="oncebox-test-victim")
    thread.start()

    def joined() -> BaseException | None:
        thread.join(30)
        assert not thread.is_alive(), "the consumer never returned"
        return raised[0] if raised else None

    return joined


# -- PostgreSQL stopped while a handler runs -----------------------------------------------------

CUT = 2  # the job whose handler runs when the server stops; 1 ran before it, 3-6 never start


def stop_mid_handler(server: PrivateServer) -> Outcome:
    """A batch of six leased; job 1's handler has run, job 2's is running when the server is
    stopped (a fast shutdown, as an operator's: the lease is durable); the consumer meets the
    outage twice, then the server answers again."""
    open_store(server.url, migrate=True).close()
    box = Box(server.url)
    runs = Runs()
    inside, go = threading.Event(), threading.Event()

    @box.task(key="outage/{n}")
    def work(ctx: Any, n: int) -> None:
        with runs.one(n):
            ctx.connection.execute("SELECT 1")  # a handler that writes touches the store
            if n == CUT and ctx.attempt == 1:
                inside.set()
                assert go.wait(30)
                ctx.connection.execute("SELECT 1")  # the server is gone: here it learns it

    try:
        with FrozenClock(box, at=T0) as clock:
            ids = {n: box.enqueue(work, n=n).job_id for n in range(1, 7)}
            consumer = box.consumer(name="victim")
            try:
                failed = _in_thread(consumer.run_once)
                assert inside.wait(30), "the handler never started"
                server.stop(mode="fast")
                go.set()
                assert isinstance(failed(), StoreUnavailable)
                with pytest.raises(StoreUnavailable):
                    consumer.run_once()  # still away: what it holds, it keeps
                server.start()
                box.store.close()  # this test's pooled connections died with the server
                given_back = consumer.run_once().released
            finally:
                consumer.session.close()
            return _settle(box, clock, ids, runs, given_back)
    finally:
        box.close()


@pytest.mark.postgres
def test_a_server_stopped_mid_batch_costs_an_attempt_only_to_the_handler_it_cut_off():
    with private_server() as server:
        outcome = stop_mid_handler(server)
    # job 1's handler completed in the transaction that never committed, 3-6 never started:
    # each ran once more, on the attempt given back
    assert outcome.given_back == 5, outcome
    assert outcome.attempts == {1: 1, CUT: 2, 3: 1, 4: 1, 5: 1, 6: 1}, outcome
    assert outcome.spent == {CUT: ["lease_expired"]}, outcome
    assert outcome.most_at_once == 1


@pytest.mark.postgres
def test_a_server_stopped_mid_batch_spends_every_attempt_without_the_give_back():
    with mutated("spend-on-outage"), private_server() as server:
        outcome = stop_mid_handler(server)
    assert outcome.given_back == 0, outcome
    assert outcome.attempts == dict.fromkeys(range(1, 7), 2), outcome
    assert outcome.spent == {n: ["lease_expired"] for n in range(1, 7)}, outcome


# -- the store away when the batch settles (both stores) -----------------------------------------

FAILS = 2  # its handler fails on its own in the batch


def settle_refused(url: str) -> Outcome:
    """A batch of four ran — job 2's handler failed on its own — and the store went away when
    the batch was to settle; it stays away for one more round, then answers."""
    box = Box(url)
    runs = Runs()

    @box.task(key="outage/{n}")
    def work(ctx: Any, n: int) -> None:
        with runs.one(n):
            if n == FAILS and ctx.attempt == 1:
                raise RuntimeError("its own failure")

    try:
        with FrozenClock(box, at=T0) as clock:
            ids = {n: box.enqueue(work, n=n).job_id for n in range(1, 5)}
            consumer, outage = _outage_consumer(box, "victim")
            try:
                outage.fail("job_finish", "job_release")  # away once the handlers ran
                with pytest.raises(StoreUnavailable):
                    consumer.run_once()
                outage.fail("job_lease", "job_release", "transaction")  # and still away
                with pytest.raises(StoreUnavailable):
                    consumer.run_once()
                assert {job_row(box, i).state for i in ids.values()} == {"leased"}
                outage.restore()
                given_back = consumer.run_once().released
            finally:
                consumer.session.close()
            return _settle(box, clock, ids, runs, given_back)
    finally:
        box.close()


def test_a_batch_the_store_went_away_under_is_given_back_unspent_when_it_answers(store_url):
    outcome = settle_refused(store_url)
    assert outcome.given_back == 3, outcome
    assert outcome.attempts == {1: 1, FAILS: 2, 3: 1, 4: 1}, outcome
    assert outcome.spent == {FAILS: ["lease_expired"]}, outcome
    assert outcome.most_at_once == 1


def test_a_batch_the_store_went_away_under_spends_every_attempt_without_its_give_back(
    store_url,
):
    with mutated("spend-on-outage"):
        outcome = settle_refused(store_url)
    assert outcome.given_back == 0, outcome
    assert outcome.attempts == dict.fromkeys(range(1, 5), 2), outcome
    assert outcome.spent == {n: ["lease_expired"] for n in range(1, 5)}, outcome


# -- a give-back too late: the lease ran out and another consumer holds the job ------------------


@dataclass(frozen=True)
class Taken:
    victim_completed: int  # what the consumer back from the outage ran
    holder_completed: int  # what the consumer that leased the jobs after the rescue ran
    holder_lease_lost: int
    states: list[str]


def give_back_too_late(url: str) -> Taken:
    """The victim strands three jobs in an outage longer than their lease; the rescuer spends
    their attempt, another consumer leases them — and the victim's store answers before that
    consumer's transaction begins."""
    box = Box(url)

    @box.task(key="late/{n}")
    def work(ctx: Any, n: int) -> None:
        pass

    holder_leased = points.Pause(only=lambda thread: thread == "oncebox-test-holder")
    try:
        with FrozenClock(box, at=T0) as clock:
            ids = [box.enqueue(work, n=n).job_id for n in range(3)]
            victim, outage = _outage_consumer(box, "victim")
            holder = box.consumer(name="holder")
            try:
                outage.fail("transaction", "job_release")
                with pytest.raises(StoreUnavailable):
                    victim.run_once()
                deadline = job_row(box, ids[0]).lease_expires_at
                assert deadline is not None
                clock.set(deadline + timedelta(seconds=1))
                rescued = LeaseRescuer(box.store, LeaseRescuerConfig(), box.metrics).run_once()
                assert rescued.ready == 3
                with points.installed({"consumer.leased": holder_leased}):
                    held: list[Any] = []
                    thread = threading.Thread(
                        target=lambda: held.append(holder.run_once()), name="oncebox-test-holder"
                    )
                    thread.start()
                    assert holder_leased.reached.wait(30), "the holder never leased"
                    outage.restore()
                    came_back = victim.run_once()
                    holder_leased.release()
                    thread.join(30)
                assert held, "the holder's round did not end"
            finally:
                victim.session.close()
                holder.session.close()
            return Taken(
                came_back.completed,
                held[0].completed,
                held[0].lease_lost,
                [job_row(box, i).state for i in ids],
            )
    finally:
        box.close()


def test_a_give_back_after_the_lease_was_rescued_and_taken_touches_nothing(store_url):
    taken = give_back_too_late(store_url)
    assert taken == Taken(0, 3, 0, ["done"] * 3)


def test_a_give_back_without_its_fence_takes_the_jobs_from_their_new_holder(store_url):
    with mutated("unfenced-give-back"):
        taken = give_back_too_late(store_url)
    assert (taken.victim_completed, taken.holder_completed, taken.holder_lease_lost) == (3, 0, 3)
