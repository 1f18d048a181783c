"""The worker as a process: graceful shutdown, the hung-handler watchdog, poison crashes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import Box, HandlerTimeout, Retry, WorkerConfig
from oncebox.kernel import points
from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.queue.watch import EXIT_HUNG_HANDLER
from oncebox.testing import FrozenClock, drain
from support.apps import digest_box
from support.db import create_effects, effects, record_effect, sql
from support.procs import (
    crash_in_handler,
    enqueue_digest,
    hang_in_handler,
    work_until_stopped,
)
from support.rows import job_attempts, job_row
from support.waiting import wait_until

SPAWN = multiprocessing.get_context("spawn")
T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
pytestmark = pytest.mark.slow


def wait_until_listening(box: Box) -> None:
    """PostgreSQL: a NOTIFY sent before the listener's LISTEN is lost, so wait for the LISTEN."""
    listening = (
        "SELECT 1 FROM pg_stat_activity WHERE query LIKE 'LISTEN oncebox_jobs;%' AND state = 'idle'"
    )
    wait_until(lambda: sql(box, listening), what="the worker's LISTEN")


def test_sigterm_finishes_the_running_transaction_and_releases_the_rest(store_url):
    box = Box(store_url)
    create_effects(box)

    @box.task(key="step/{n}")
    def step(ctx, n: int) -> None:
        pass

    for n in range(5):
        box.enqueue(step, n=n)
    inside, proceed = SPAWN.Event(), SPAWN.Event()
    worker = SPAWN.Process(target=work_until_stopped, args=(store_url, inside, proceed))
    worker.start()
    try:
        assert inside.wait(30), "the worker never started a handler"
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGTERM)
        proceed.set()
        worker.join(30)
        assert worker.exitcode == 0
    finally:
        if worker.is_alive():
            worker.kill()
    states = sorted((j.state, j.attempt) for n in range(5) for j in box.find(f"step/{n}"))
    assert states == [("done", 1)] + [("ready", 0)] * 4  # released without spending attempts
    assert len(effects(box)) == 1
    box.close()


def test_the_watchdog_ends_a_worker_whose_handler_hangs(store_url):
    box = Box(store_url)

    @box.task(key="hang/{n}", timeout=0.2)
    def hang(ctx, n: int) -> None:
        pass

    with FrozenClock(box, at=T0) as clock:
        job = box.enqueue(hang, n=1).job_id
        inside = SPAWN.Event()
        worker = SPAWN.Process(target=hang_in_handler, args=(store_url, inside))
        worker.start()
        assert inside.wait(30)
        worker.join(30)
        assert worker.exitcode == EXIT_HUNG_HANDLER
        assert job_row(box, job).state == "leased"
        clock.advance(timedelta(hours=1))
        LeaseRescuer(box.store, LeaseRescuerConfig(), box.metrics).run_once()
    row = job_row(box, job)
    assert (row.state, row.attempt) == ("ready", 1)
    assert [a.outcome for a in job_attempts(box, job)] == ["lease_expired"]
    box.close()


def test_a_poison_job_that_kills_its_worker_is_dead_after_max_attempts(store_url):
    box = Box(store_url)

    @box.task(key="poison/{n}", retry=Retry(max_attempts=2))  # the budget is stored at enqueue
    def poison(ctx, n: int) -> None:
        pass

    with FrozenClock(box, at=T0) as clock:
        job = box.enqueue(poison, n=1).job_id
        for _crash in range(2):
            worker = SPAWN.Process(target=crash_in_handler, args=(store_url,))
            worker.start()
            worker.join(60)
            assert worker.exitcode == -signal.SIGKILL
            clock.advance(timedelta(hours=1))
            LeaseRescuer(box.store, LeaseRescuerConfig(), box.metrics).run_once()
    row = job_row(box, job)
    assert (row.state, row.attempt) == ("dead", 2)
    attempts = job_attempts(box, job)
    assert [(a.attempt, a.outcome) for a in attempts] == [
        (1, "lease_expired"),
        (2, "lease_expired"),
    ]
    box.close()


def test_a_handler_that_returns_after_its_timeout_fails_its_attempt(store_url):
    box = Box(store_url)
    create_effects(box)

    @box.task(key="slow/{n}", timeout=0.05)
    def slow(ctx, n: int) -> None:
        record_effect(ctx, "too late")
        threading.Event().wait(0.2)  # the handler's own work, overrunning its timeout

    with FrozenClock(box, at=T0):  # its retry is not due again within this drain
        box.enqueue(slow, n=1)
        result = drain(box, raise_on_failure=False)
    assert result.retried == 1
    assert HandlerTimeout.__name__ in result.failures[0].error
    assert effects(box) == []
    box.close()


def test_until_idle_does_not_stop_on_a_dispatcher_round_that_looked_before_the_outbox_rows(
    store_url,
):
    """The dispatcher finds nothing; before it reports idle, a consumer commits outbox rows and
    wakes the lanes. The dispatcher's empty round began before the rows existed, so it proves
    nothing: an until-idle run must look again and send them, not stop with them unsent."""
    from oncebox import WorkerConfig
    from oncebox.kernel import points

    box = Box(store_url, secret="s" * 32)
    box.channel("email", provider="null:")

    @box.task(key="mail/{n}")
    def mail(ctx, n: int) -> None:
        ctx.outbox.email(to=f"c{n}@example.com", subject="digest", text="hello")

    box.enqueue(mail, n=1)
    looked = threading.Event()
    committed = threading.Event()
    woken_after_commit = threading.Event()

    def dispatcher_found_nothing(_name: str) -> None:
        if not looked.is_set():
            looked.set()  # let the consumer write its rows now, then wake everyone
            assert woken_after_commit.wait(20), "the consumer never committed and woke the lanes"

    def consumer_before_transaction(_name: str) -> None:
        assert looked.wait(20), "the dispatcher never looked"

    def woken(_name: str) -> None:
        if committed.is_set():
            woken_after_commit.set()

    actions = {
        "dispatcher.found_nothing": dispatcher_found_nothing,
        "consumer.before_transaction": consumer_before_transaction,
        "consumer.committed": lambda _name: committed.set(),
        "worker.woken": woken,
    }
    try:
        with points.installed(actions):
            result = box.work(config=WorkerConfig(until_idle=True))
    finally:
        box.close()
    assert result.consumed.completed == 1
    assert result.dispatched.sent == 1


def test_an_idle_worker_wakes_for_a_job_another_process_enqueued_not_by_its_poll(store_url):
    """The listener: a NOTIFY on PostgreSQL, a commit seen in the database files on SQLite. The
    worker's poll is an hour, so only the listener can explain the job running in seconds."""
    box = digest_box(store_url)
    create_effects(box)
    idle, committed = threading.Event(), threading.Event()
    worker = box.worker(WorkerConfig(poll_interval=timedelta(hours=1), dispatch=False))
    actions = {
        "consumer.found_nothing": lambda _name: idle.set(),
        "consumer.committed": lambda _name: committed.set(),
    }
    with points.installed(actions):
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert idle.wait(30), "the worker's first round never came back empty"
            if box.store.dialect == "postgres":
                wait_until_listening(box)
            producer = SPAWN.Process(target=enqueue_digest, args=(store_url, 42))
            producer.start()
            producer.join(60)
            assert producer.exitcode == 0
            assert committed.wait(10), "no wake-up within 10 s (the worker's poll is 1 h)"
            assert [row[0] for row in effects(box)] == ["weekly-digest/customer-42/2026-W33"]
        finally:
            worker.stop()
            thread.join(30)
            box.close()


@pytest.mark.postgres
def test_a_job_enqueued_by_another_process_wakes_the_consumer_not_the_dispatcher(pg_url):
    """A job's NOTIFY is for consumers: an idle dispatcher that also ran a lease round for each
    one tripled the pick-up latency at 200 jobs/s (docs/benchmarks.md). The dispatcher still
    wakes for outbox rows (tests/store_contract/test_store_notifications.py)."""
    box = digest_box(pg_url)
    create_effects(box)
    consumer_idle, dispatcher_idle, committed = (threading.Event() for _ in range(3))
    dispatcher_rounds = []
    worker = box.worker(WorkerConfig(poll_interval=timedelta(hours=1)))

    def dispatcher_found_nothing(_name: str) -> None:
        dispatcher_rounds.append(1)
        dispatcher_idle.set()

    actions = {
        "consumer.found_nothing": lambda _name: consumer_idle.set(),
        "dispatcher.found_nothing": dispatcher_found_nothing,
        "consumer.committed": lambda _name: committed.set(),
    }
    with points.installed(actions):
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert consumer_idle.wait(30) and dispatcher_idle.wait(30), "never idle"
            wait_until_listening(box)
            before, dispatcher_idle = len(dispatcher_rounds), threading.Event()
            consumer_idle.clear()
            producer = SPAWN.Process(target=enqueue_digest, args=(pg_url, 42))
            producer.start()
            producer.join(60)
            assert producer.exitcode == 0
            assert committed.wait(10), "the consumer was not woken (its poll is 1 h)"
            assert consumer_idle.wait(10), "the consumer did not look again after its batch"
            # the dispatcher, woken with it, would have leased by now; give it a second more
            assert not dispatcher_idle.wait(1.0), "the job's NOTIFY ran a dispatcher round"
            assert len(dispatcher_rounds) == before
        finally:
            worker.stop()
            thread.join(30)
            box.close()
