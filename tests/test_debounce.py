"""Debounce and throttle, end to end on every store: enqueues within a window collapse into one
pending job with the arguments declared (last or first), on the store's frozen clock; a job
already running is never the one joined; racing enqueuers in several processes make one."""

from __future__ import annotations

import json
import multiprocessing
import threading
from datetime import UTC, datetime, timedelta
from enum import Enum

import psycopg
import pytest

from oncebox import (
    Box,
    Concurrency,
    ConfigurationError,
    ConsumerConfig,
    Debounce,
    JobContext,
    Throttle,
)
from oncebox.jobs.periods import iso_week
from oncebox.testing import FrozenClock, drain
from support.db import sql
from support.limits_app import enqueue_burst, limited_box

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
SPAWN = multiprocessing.get_context("spawn")


def collapsing_box(url: str, ran: list[tuple[str, int, int]], **declared) -> Box:
    box = Box(url)

    @box.task(**declared)
    def preview(ctx: JobContext, customer: int, edit: int) -> None:
        ran.append(("preview", customer, edit))

    return box


def test_a_burst_of_enqueues_runs_once_a_window_after_the_last_with_its_arguments(store_url):
    ran: list[tuple[str, int, int]] = []
    box = collapsing_box(store_url, ran, debounce=Debounce(timedelta(seconds=30), by="{customer}"))
    with FrozenClock(box, at=T0) as clock:
        results = []
        for edit in range(4):
            results.append(box.enqueue("preview", customer=1, edit=edit))
            clock.advance(timedelta(seconds=20))
        other = box.enqueue("preview", customer=2, edit=0)  # another debounce key
        assert [r.created for r in results] == [True, False, False, False]
        assert {r.job_id for r in results} == {results[0].job_id}
        assert str(results[1]) == f"joined pending job {results[0].job_id}"
        drain(box)
        assert ran == []  # the last edit came 20 s ago: 10 s to go
        clock.advance(timedelta(seconds=10))
        drain(box)
        assert ran == [("preview", 1, 3)]
        clock.advance(timedelta(seconds=20))
        drain(box)
        assert ran == [("preview", 1, 3), ("preview", 2, 0)] and other.created
    counted = box.store.counter_list()
    assert (counted["jobs_enqueued"], counted["enqueue_collapsed"]) == (2, 3)
    box.close()


def test_max_wait_runs_a_debounced_job_however_long_the_burst_lasts(store_url):
    ran: list[tuple[str, int, int]] = []
    debounce = Debounce(timedelta(seconds=30), max_wait=timedelta(minutes=1), keep="first")
    box = collapsing_box(store_url, ran, debounce=debounce)
    with FrozenClock(box, at=T0) as clock:
        for edit in range(10):  # an edit every 15 s: the window alone would never close
            box.enqueue("preview", customer=1, edit=edit)
            drain(box)
            clock.advance(timedelta(seconds=15))
        # due a minute after the first enqueue, with the first one's arguments (keep="first")
        assert ran[0] == ("preview", 1, 0)
        assert len(ran) == 2  # and the edits after it made the next pending job
    box.close()


def test_a_throttled_task_runs_at_once_then_at_most_once_per_window(store_url):
    ran: list[tuple[str, int, int]] = []
    box = collapsing_box(store_url, ran, throttle=Throttle(timedelta(minutes=1)))
    with FrozenClock(box, at=T0) as clock:
        for edit in range(3):
            box.enqueue("preview", customer=1, edit=edit)
        drain(box)
        assert ran == [("preview", 1, 2)]  # at once, with the last arguments
        for edit in range(10, 13):
            box.enqueue("preview", customer=1, edit=edit)
        drain(box)
        assert len(ran) == 1  # the next may run a minute after the last one's time
        clock.advance(timedelta(seconds=59))
        drain(box)
        assert len(ran) == 1
        clock.advance(timedelta(seconds=1))
        drain(box)
        assert ran == [("preview", 1, 2), ("preview", 1, 12)]
        clock.advance(timedelta(minutes=5))  # a quiet spell: the next runs at once again
        box.enqueue("preview", customer=1, edit=20)
        drain(box)
        assert ran[-1] == ("preview", 1, 20)
    box.close()


def test_an_enqueue_while_the_pending_job_runs_makes_the_next_one(store_url):
    ran: list[tuple[str, int, int]] = []
    box = Box(store_url)
    inside = threading.Event()

    @box.task(debounce=Debounce(timedelta(seconds=1)))
    def preview(ctx: JobContext, customer: int, edit: int) -> None:
        if not ran:  # the first run enqueues the next edit while it runs (in its transaction)
            later = box.enqueue(
                "preview", connection=ctx.connection, customer=customer, edit=edit + 1
            )
            assert later.created, later
            inside.set()
        ran.append(("preview", customer, edit))

    with FrozenClock(box, at=T0) as clock:
        box.enqueue("preview", customer=1, edit=0)
        clock.advance(timedelta(seconds=1))
        drain(box)
        assert inside.is_set() and ran == [("preview", 1, 0)]
        clock.advance(timedelta(seconds=1))
        drain(box)
        assert ran == [("preview", 1, 0), ("preview", 1, 1)]
    box.close()


def test_a_keyed_debounced_task_takes_the_newest_key_unless_it_is_taken(store_url):
    ran: list[tuple[str, int, int]] = []
    box = collapsing_box(
        store_url, ran, key="preview/{customer}/{edit}", debounce=Debounce(timedelta(seconds=5))
    )
    with FrozenClock(box, at=T0) as clock:
        first = box.enqueue("preview", customer=1, edit=1)
        joined = box.enqueue("preview", customer=1, edit=2)
        assert (joined.reason, joined.job_id, joined.key) == (
            "collapsed",
            first.job_id,
            "preview/1/2",
        )
        clock.advance(timedelta(seconds=5))
        drain(box)
        assert ran == [("preview", 1, 2)]
        again = box.enqueue("preview", customer=1, edit=2)  # that operation happened
        assert (again.created, again.reason) == (False, "key_claimed")
        assert sql(box, "SELECT key FROM oncebox_intents") == [("preview/1/2",)]
    box.close()


def test_racing_enqueuers_in_threads_and_processes_make_one_pending_job(store_url, tmp_path):
    counts = tmp_path / "counts.json"
    setup = limited_box(store_url, counts, together=1)
    barrier = SPAWN.Barrier(6)
    racers = [
        SPAWN.Process(
            target=enqueue_burst,
            args=(store_url, str(counts), list(range(i * 10, i * 10 + 5)), barrier),
        )
        for i in range(3)
    ] + [
        threading.Thread(
            target=enqueue_burst,
            args=(store_url, str(counts), list(range(i * 10, i * 10 + 5)), barrier),
        )
        for i in range(3, 6)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(60)
        assert getattr(racer, "exitcode", 0) == 0
    pending = sql(setup, "SELECT state, debounce_key FROM oncebox_all_jobs")
    assert pending == [("ready", "preview/1")]
    counted = setup.store.counter_list()
    assert (counted["jobs_enqueued"], counted["enqueue_collapsed"]) == (1, 29)
    setup.close()


def test_a_debounced_enqueue_in_a_rolled_back_transaction_leaves_the_pending_job_as_it_was(
    pg_url,
):
    ran: list[tuple[str, int, int]] = []
    box = collapsing_box(pg_url, ran, debounce=Debounce(timedelta(seconds=30)))
    first = box.enqueue("preview", customer=1, edit=1)
    with psycopg.connect(pg_url) as conn:
        joined = box.enqueue("preview", connection=conn, customer=1, edit=2)
        assert joined.job_id == first.job_id
        conn.rollback()
    [(args,)] = sql(box, "SELECT args::text FROM oncebox_all_jobs")
    assert '"edit": 1' in args
    box.close()


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"debounce": Debounce(timedelta(0))}, "the debounce window must be a timedelta within"),
        ({"debounce": Debounce(30)}, "the debounce window must be a timedelta"),  # type: ignore[arg-type]
        ({"debounce": Throttle(timedelta(seconds=1))}, "debounce= takes oncebox.Debounce(window)"),
        (
            {
                "debounce": Debounce(timedelta(seconds=1)),
                "throttle": Throttle(timedelta(seconds=1)),
            },
            "give debounce= or throttle=, not both",
        ),
        (
            {"debounce": Debounce(timedelta(minutes=1), max_wait=timedelta(seconds=1))},
            "max_wait must be at least the debounce window",
        ),
        (
            {"throttle": Throttle(timedelta(seconds=1), keep="all")},  # type: ignore[arg-type]
            "keep= is 'last' or 'first'",
        ),
        (
            {"throttle": Throttle(timedelta(seconds=1), by="{tenant}")},
            "throttle by '{tenant}' uses tenant, which the handler does not take",
        ),
    ],
)
def test_a_debounce_declared_wrongly_is_refused_where_it_is_declared(tmp_path, declared, message):
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")
    with pytest.raises(ConfigurationError) as refused:

        @box.task(name="preview", **declared)
        def preview(ctx: JobContext, customer: int) -> None:
            pass

    assert message in str(refused.value) and str(refused.value).startswith("task 'preview': ")
    box.close()


def test_a_debounced_task_refuses_a_run_time_and_a_bulk_enqueue(tmp_path):
    box = collapsing_box(
        f"sqlite:///{tmp_path / 'o.db'}", [], debounce=Debounce(timedelta(seconds=5))
    )
    with pytest.raises(ConfigurationError, match="is debounced: its jobs run when the debounce"):
        box.enqueue("preview", delay=timedelta(seconds=1), customer=1, edit=1)
    with pytest.raises(ConfigurationError, match="enqueue its jobs one by one"):
        box.enqueue_many("preview", [{"customer": 1, "edit": 1}])
    assert sql(box, "SELECT count(*) FROM oncebox_all_jobs") == [(0,)]
    box.close()


def test_a_lease_passes_over_a_pending_job_an_open_enqueue_is_merging_into(pg_url):
    """The limited lease never waits on a row an enqueue's transaction holds (nor takes it as
    it was): it passes over it, and takes it once that transaction ends."""
    box = Box(pg_url)

    @box.task(limits=[Concurrency(5)], throttle=Throttle(timedelta(minutes=1)))
    def sync(ctx: JobContext, customer: int) -> None:
        pass

    first = box.enqueue(sync, customer=1)  # a throttle's first job is due at once
    consumer = box.consumer(ConsumerConfig(lock_timeout=timedelta(milliseconds=200)))
    try:
        with psycopg.connect(pg_url) as conn:
            joined = box.enqueue(sync, connection=conn, customer=2)
            assert joined.job_id == first.job_id  # merged, its row locked until this commits
            assert consumer.transport.fetch(10) == []  # passed over, not waited for
            conn.commit()
        [leased] = consumer.transport.fetch(10)
        assert (leased.job_id, json.loads(leased.args_json)) == (first.job_id, {"customer": 2})
    finally:
        consumer.session.close()
        box.close()


def test_the_debounce_key_is_rendered_from_the_arguments_as_stored(tmp_path):
    class Region(str, Enum):  # noqa: UP042 (str() of it is "Region.EU", unlike a StrEnum's)
        EU = "eu"

    box = Box(f"sqlite:///{tmp_path / 'o.db'}")

    @box.task(debounce=Debounce(timedelta(seconds=5), by="{region}"))
    def refresh(ctx: JobContext, region: str) -> None:
        pass

    first = box.enqueue(refresh, region=Region.EU)
    again = box.enqueue(refresh, region="eu")  # the same stored value: the same pending job
    assert (again.reason, again.job_id) == ("collapsed", first.job_id)
    assert sql(box, "SELECT debounce_key FROM oncebox_all_jobs") == [("refresh/eu",)]
    box.close()


def test_a_schedule_of_a_debounced_task_is_refused_where_it_is_declared(tmp_path):
    box = collapsing_box(
        f"sqlite:///{tmp_path / 'o.db'}", [], debounce=Debounce(timedelta(seconds=5))
    )
    with pytest.raises(ConfigurationError, match="task 'preview' is debounced"):

        @box.schedule("previews", cron="0 9 * * 1", period=iso_week, task="preview")
        def eligible(ctx):
            return []

    box.close()
