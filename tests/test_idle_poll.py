"""An idle lane's fallback poll asks what is due first — one statement — and leases only when
something is; a job that falls due while nothing wakes the lane is still leased by that poll."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

from oncebox import Box, SchemaError, WorkerConfig
from support.waiting import wait_until

POLL = timedelta(milliseconds=50)


def calls(box: Box, operation: str) -> int:
    found = box.metrics.operations().get(operation)
    return 0 if found is None else found.calls


def test_an_idle_consumer_probes_what_is_due_and_leases_only_when_something_is(store_url):
    box = Box(store_url)
    done: list[int] = []

    @box.task(key="reminder/{n}")
    def reminder(ctx: object, n: int) -> None:
        done.append(n)

    worker = box.worker(WorkerConfig(poll_interval=POLL, dispatch=False))
    thread = threading.Thread(target=worker.run, name="idle-worker")
    thread.start()
    try:
        wait_until(lambda: calls(box, "job_next_due") >= 15, timeout=60, what="15 idle polls")
        probes, leases = calls(box, "job_next_due"), calls(box, "job_lease")
        # each poll used to be a lease and a probe; a lease now follows only a wake-up (on
        # SQLite, a commit seen in the files: this worker's own presence beat)
        assert leases * 3 <= probes, (leases, probes)

        box.enqueue(reminder, n=1, delay=timedelta(milliseconds=300))
        wait_until(lambda: done == [1], timeout=60, what="the delayed job, leased by a poll")
    finally:
        worker.stop()
        thread.join(30)
        box.close()


@pytest.mark.postgres
def test_an_until_idle_run_ends_once_another_worker_finished_what_it_waited_for(pg_url):
    """An until-idle run that finds a job leased by another worker waits for it; when that
    worker completes it, nothing wakes the run, and it must still end — it looks again after
    its poll, it does not only probe for due work. (PostgreSQL: on SQLite the other worker's
    running handler holds the write lock the run needs to start.)"""
    box = Box(pg_url)
    started, release = threading.Event(), threading.Event()

    @box.task(key="report/{n}")
    def report(ctx: object, n: int) -> None:
        started.set()
        assert release.wait(60), "the test never released the handler"

    box.enqueue(report, n=1)
    daemon = box.worker(WorkerConfig(poll_interval=POLL, dispatch=False))
    daemon_thread = threading.Thread(target=daemon.run, name="daemon-worker")
    daemon_thread.start()
    drain_thread: threading.Thread | None = None
    try:
        assert started.wait(60), "the daemon worker never ran the job"
        drain = box.worker(WorkerConfig(poll_interval=POLL, until_idle=True, dispatch=False))
        drain_thread = threading.Thread(target=drain.run, name="until-idle-worker")
        drain_thread.start()
        wait_until(lambda: calls(box, "backlog_list") >= 2, timeout=60, what="the run to wait")
        release.set()
        drain_thread.join(60)
        assert not drain_thread.is_alive(), "the until-idle run never ended"
    finally:
        release.set()
        daemon.stop()
        daemon_thread.join(30)
        if drain_thread is not None:
            drain_thread.join(30)
        box.close()


@pytest.mark.postgres
def test_a_database_damaged_under_an_idle_worker_stops_it_with_the_error(pg_url):
    """The idle poll's probe meets the damage first (no round runs while nothing is due): the
    worker must stop and raise it, as a round would — not lose the lane and carry on."""
    box = Box(pg_url)

    @box.task(key="report/{n}")
    def report(ctx: object, n: int) -> None:
        pass

    worker = box.worker(WorkerConfig(poll_interval=POLL))
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # the test reads what the run raised
            raised.append(exc)

    thread = threading.Thread(target=run, name="idle-worker")
    thread.start()
    try:
        wait_until(lambda: calls(box, "job_next_due") >= 3, timeout=60, what="idle polls")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE oncebox_jobs RENAME TO oncebox_jobs_gone")
        thread.join(60)
        assert not thread.is_alive(), "the worker went on without its lane"
        assert len(raised) == 1 and isinstance(raised[0], SchemaError), raised
    finally:
        worker.stop()
        thread.join(30)
        box.close()
