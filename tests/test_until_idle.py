"""`worker --until-idle` is trustworthy: it keeps working while its own work falls due within a
horizon (a retry's backoff, a channel's pause, a stranded lease), and when it stops with work
left it says what and when — exit 0 only when nothing remains. Jobs of a task that no live
worker serves are named, not left waiting in silence. On the real clock: these are the waits
`until_idle` is for."""

from __future__ import annotations

import json
import logging
import threading
from datetime import timedelta

import pytest

from oncebox import Box, WorkerConfig
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.lanes import worker as worker_module
from oncebox.outbox.tokens import derive_token
from oncebox.store.params import WorkerBeat
from support.outbox import SECRET, enqueue_customers
from support.waiting import wait_until
from test_cli import oncebox

NEAR = timedelta(seconds=1.5)
FAR = timedelta(hours=2)


def timed_box(url: str) -> Box:
    box = Box(url)

    @box.task(key="timed/{n}")
    def timed(ctx, n: int) -> None:
        pass

    return box


def test_until_idle_waits_for_work_due_within_its_horizon_and_reports_the_rest(store_url):
    box = timed_box(store_url)
    box.enqueue("timed", n=1, delay=NEAR)
    box.enqueue("timed", n=2, delay=FAR)
    result = box.work(config=WorkerConfig(until_idle=True, idle_horizon=timedelta(seconds=60)))
    assert result.consumed.completed == 1  # it waited for the job due in 1.5 s
    assert box.find("timed/1")[0].state == "done"
    assert not result.settled
    [left] = result.remaining
    assert (left.kind, left.name, left.waiting, left.held) == ("job", "timed", 1, 0)
    assert left.next_due_at is not None and result.now is not None
    assert timedelta(hours=1) < left.next_due_at - result.now <= FAR
    box.close()


def test_until_idle_with_nothing_left_is_settled(store_url):
    box = timed_box(store_url)
    box.enqueue("timed", n=1)
    result = box.work(until_idle=True)
    assert result.settled and result.remaining == [] and result.consumed.completed == 1
    box.close()


def test_until_idle_waits_out_a_channels_short_pause_and_delivers(store_url, mail_box):
    with FakeEmailApi() as api:
        box = mail_box(store_url, api.url)
        api.script("429:2")  # the provider asks the whole channel to wait two seconds
        enqueue_customers(box, [1, 2])
        result = box.work(until_idle=True)
        assert result.settled, result.remaining
        assert result.dispatched.throttled == 1 and result.dispatched.sent == 2
        assert sorted(str(t) for t in api.tokens()) == sorted(
            derive_token(SECRET, f"weekly-digest/customer-{c}/2026-W33") for c in (1, 2)
        )
        box.close()


def test_the_cli_says_what_remains_and_exits_3_when_work_is_due_beyond_the_horizon(tmp_path):
    url = f"sqlite:///{tmp_path / 'left.db'}"
    app = tmp_path / "leftapp.py"
    app.write_text(
        "from oncebox import Box\n"
        "box = Box()\n"
        "@box.task(key='timed/{n}')\n"
        "def timed(ctx, n: int) -> None:\n"
        "    pass\n"
    )
    box = timed_box(url)
    box.enqueue("timed", n=1, delay=FAR)
    box.close()
    result = oncebox("worker", "--app", "leftapp", "--db", url, "--until-idle", cwd=tmp_path)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert "remaining, by the database's clock" in result.stdout
    assert "job(s) of task timed: 1 ready, next due" in result.stdout
    assert "(in 1h)" in result.stdout or "(in 119m)" in result.stdout, result.stdout
    waits = oncebox(
        "worker", "--app", "leftapp", "--db", url, "--until-idle", "--wait-up-to", "0", cwd=tmp_path
    )
    assert waits.returncode == 3
    status = json.loads(oncebox("status", "--db", url, "--json").stdout)
    assert [(b["kind"], b["name"], b["waiting"]) for b in status["backlog"]] == [
        ("job", "timed", 1)
    ]


def test_jobs_of_a_task_no_live_worker_serves_are_named_by_the_worker_and_status(
    store_url, caplog, monkeypatch
):
    old = timed_box(store_url)

    @old.task(key="removed/{n}")
    def removed(ctx, n: int) -> None:
        pass

    old.enqueue(removed, n=1)
    old.enqueue(removed, n=2)
    old.close()

    box = timed_box(store_url)  # this deploy no longer has `removed`
    result = box.work(until_idle=True)
    assert not result.settled and result.unserved == ["removed"]
    assert [(r.name, r.waiting) for r in result.remaining] == [("removed", 2)]

    monkeypatch.setattr(worker_module, "PRESENCE_EVERY", 0.05)
    running = box.worker()
    thread = threading.Thread(target=running.run)
    with caplog.at_level(logging.WARNING, logger="oncebox.worker"):
        thread.start()
        try:
            wait_until(
                lambda: "no live worker serves that task" in caplog.text,
                what="the worker to log the unserved task",
            )
            wait_until(
                lambda: any(w.live for w in box.store.worker_list(timedelta(minutes=1))),
                what="the running worker's row",
            )
            [live] = [w for w in box.store.worker_list(timedelta(minutes=1)) if w.live]
            assert live.tasks == ("timed",)
        finally:
            running.stop()
            thread.join(60)
    assert "2 job(s) of task 'removed' wait" in caplog.text
    assert not any(w.live for w in box.store.worker_list(timedelta(minutes=1)))  # it stopped
    box.close()


@pytest.mark.parametrize("served", [True, False])
def test_status_lists_unserved_tasks_under_attention(tmp_path, served):
    url = f"sqlite:///{tmp_path / 'unserved.db'}"
    box = timed_box(url)
    box.enqueue("timed", n=1)
    if served:
        box.store.worker_beat(WorkerBeat("h:1:w1", "h", 1, ("timed",), ("default",), ()))
    box.close()
    data = json.loads(oncebox("status", "--db", url, "--json").stdout)
    text = oncebox("status", "--db", url).stdout
    if served:
        assert data["unserved_tasks"] == [] and data["workers_live"] == 1
        assert "no live worker" not in text
    else:
        assert data["unserved_tasks"] == [{"task": "timed", "waiting": 1}]
        assert "1 job(s) of task timed wait with no live worker serving it" in text


def test_until_idle_waits_for_a_stranded_lease_to_run_out_and_finishes_the_job(store_url):
    from oncebox import ConsumerConfig
    from oncebox.lanes.lease_rescuer import LeaseRescuerConfig
    from oncebox.queue.watch import HandlerWatch

    box = Box(store_url)

    @box.task(key="timed/{n}", timeout=0.5)
    def timed(ctx, n: int) -> None:
        pass

    box.enqueue("timed", n=1)
    # a consumer that leases the job for about a second (on SQLite a lease outlasts a whole
    # transaction: the handler's timeout and its grace), and then "dies"
    quick = HandlerWatch(timedelta(seconds=0.3), exit_on_hang=False)
    dead = box.consumer(ConsumerConfig(lease=timedelta(seconds=1)), watch=quick)
    assert len(dead.transport.fetch(10)) == 1  # leased by a consumer that then "dies"
    dead.session.close()
    config = WorkerConfig(
        until_idle=True, rescuer=LeaseRescuerConfig(interval=timedelta(milliseconds=200))
    )
    result = box.work(config=config)
    assert result.settled, result.remaining
    job = box.find("timed/1")[0]
    assert (job.state, job.attempt) == ("done", 2)  # the stranded attempt is counted
    box.close()
