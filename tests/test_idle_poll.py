"""An idle lane's fallback poll asks what is due first — one statement — and leases only when
something is; a job that falls due while nothing wakes the lane is still leased by that poll."""

from __future__ import annotations

import threading
from datetime import timedelta

from oncebox import Box, WorkerConfig
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
