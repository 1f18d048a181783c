"""Limits on tasks, end to end: declared on the task, checked where declared, rendered at
enqueue, and enforced across worker processes on every store."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from oncebox import Box, Concurrency, ConfigurationError, InvalidKey, JobContext, Rate, shapes
from oncebox.chaos.mutations import mutated
from oncebox.cli import prometheus
from oncebox.cli.inspect_cmds import limits_table, quiet_line
from oncebox.jobs.limits import plan_of, task_limits
from oncebox.kernel.clock import ClockSetting, from_micros
from oncebox.status import status_data
from oncebox.store import open_store
from oncebox.testing import FrozenClock, drain
from support.contract import insert, lease, opened_session
from support.db import sql
from support.limits_app import (
    GLOBAL,
    PER_TENANT,
    RATE,
    hold_slot,
    limited_box,
    rate_box,
    read_counts,
    work_limited,
    work_rated,
)

SPAWN = multiprocessing.get_context("spawn")
T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"limits": [Concurrency(0)]}, "Concurrency(0) must be within 1..100000"),
        ({"limits": [Concurrency(True)]}, "Concurrency(True) needs an int"),
        ({"limits": [Rate("fast")]}, "rate limit 'fast' is not COUNT/PERIOD"),
        ({"limits": Concurrency(2)}, "limits= must be a list"),
        ({"limits": ["10/s"]}, "'10/s' is not a limit; use oncebox.Concurrency(n)"),
        ({"limits": [Concurrency(2), Concurrency(3)]}, "two limits are both 'job:concurrency'"),
        ({"limits": [Concurrency(2, name="~throttle")]}, "not starting with '~'"),
        ({"limits": [Concurrency(2, per_partition=True)]}, "a per-partition limit needs"),
        ({"limits": [Concurrency(2)], "partition": "{tenant}"}, "partition= is used only by"),
        ({"partition": "{tenant}"}, "partition= is used only by a per-partition limit"),
        (
            {"limits": [Concurrency(2, per_partition=True)], "partition": "{region}"},
            "partition '{region}' uses region, which the handler does not take",
        ),
        (
            {"limits": [Concurrency(2, per_partition=True)], "partition": "{tenant.id}"},
            "placeholder '{tenant.id}' must be a plain argument name",
        ),
    ],
)
def test_a_limit_declared_wrongly_is_refused_where_it_is_declared(tmp_path, declared, message):
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")
    try:
        with pytest.raises(ConfigurationError) as refused:

            @box.task(name="job", **declared)
            def job(ctx: JobContext, tenant: str) -> None:
                pass

        assert message in str(refused.value)
        assert str(refused.value).startswith("task 'job': ")
        assert "job" not in box.registry
    finally:
        box.close()


def test_a_task_sharing_a_limit_name_with_a_different_limit_is_refused_and_not_registered(
    tmp_path,
):
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")
    try:

        @box.task(limits=[Concurrency(2, name="api")])
        def first(ctx: JobContext) -> None:
            pass

        with pytest.raises(ConfigurationError, match="limit 'api' is declared differently"):

            @box.task(limits=[Rate("5/s", name="api")])
            def second(ctx: JobContext) -> None:
                pass

        assert box.registry.names() == ["first"]
    finally:
        box.close()


def test_a_job_whose_partition_cannot_be_rendered_is_refused_and_nothing_is_written(tmp_path):
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")
    try:

        @box.task(partition="{tenant}", limits=[Concurrency(1, per_partition=True)])
        def export(ctx: JobContext, tenant: str) -> None:
            pass

        with pytest.raises(InvalidKey, match=r"task 'export': partition: .*contains '/'"):
            box.enqueue(export, tenant="a/b")
        box.enqueue(export, tenant="acme")
        assert sql(box, "SELECT limit_key FROM oncebox_all_jobs") == [("acme",)]
    finally:
        box.close()


@pytest.mark.slow
def test_four_worker_processes_never_run_more_than_the_limits_allow(store_url, tmp_path):
    """Handlers count themselves in and out of a shared file; on PostgreSQL each waits for as
    many peers as the limits allow, so a limit that let a fourth in would be seen."""
    counts = tmp_path / "counts.json"
    setup = limited_box(store_url, counts, together=1)
    tenants = ["a", "b", "c", "d", "e"]
    for tenant in tenants:
        for n in range(3):
            setup.enqueue("export", tenant=tenant, n=n)
    setup.close()
    together = GLOBAL if store_url.startswith("postgresql") else 1  # SQLite: one writer
    workers = [
        SPAWN.Process(target=work_limited, args=(store_url, str(counts), together))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    seen = read_counts(counts)
    assert seen["runs"] == 15
    assert seen["peak"]["all"] == together, seen  # never more, and (PostgreSQL) as many
    assert all(seen["peak"][tenant] == PER_TENANT for tenant in tenants), seen
    assert seen["leased_peak"]["all"] <= GLOBAL, seen  # what the store held leased, too
    assert all(seen["leased_peak"][tenant] <= PER_TENANT for tenant in tenants), seen


def test_jobs_of_a_limited_task_carry_their_partition_and_others_none(tmp_path: Path):
    box = limited_box(f"sqlite:///{tmp_path / 'o.db'}", tmp_path / "c.json", together=1)
    try:
        box.enqueue("export", tenant="acme", n=1)
        box.enqueue("ping", n=1)
        rows = sql(box, "SELECT task, limit_key FROM oncebox_all_jobs ORDER BY id")
        assert rows == [("export", "acme"), ("ping", "")]
    finally:
        box.close()


def test_status_the_metrics_and_the_console_show_what_each_limit_holds_back(tmp_path: Path):
    """A partition starved behind the others shows as the longest wait, in every view."""
    box = limited_box(f"sqlite:///{tmp_path / 'o.db'}", tmp_path / "c.json", together=1)
    try:
        with FrozenClock(box, at=T0) as clock:
            for n in range(3):
                box.enqueue("export", tenant="starved", n=n)
            clock.advance(timedelta(minutes=40))
            for tenant in ("a", "b"):
                box.enqueue("export", tenant=tenant, n=0)
            consumer = box.consumer()
            try:  # one lease takes a slot of "starved"; the job stays leased
                assert consumer.transport.fetch(10)[0].args_json == '{"n":0,"tenant":"starved"}'
            finally:
                consumer.session.close()
            data = status_data(box, 1)
        rows = {(e["limit"], e["partition"]): e for e in data["limits"]}
        whole = rows[("export:concurrency", None)]
        assert (whole["running"], whole["waiting"], whole["oldest_wait_s"]) == (1, 4, 2400.0)
        starved = rows[("export:concurrency/partition", "starved")]
        assert (starved["running"], starved["waiting"], starved["declared"]) == (
            1,
            2,
            "1 at once per partition",
        )
        assert rows[("export:concurrency/partition", "a")]["oldest_wait_s"] == 0.0
        shown = [e["partition"] for e in shapes.limits_shown(data["limits"])]
        assert shown[:3] == [None, None, "starved"]  # the longest wait first
        text = "\n".join("  ".join(row) for row in limits_table(data["limits"], T0))
        assert re.search(r"export:concurrency\s+all\s+3 at once\s+1\s+4\s+40m", text), text
        metrics = {
            (m.name, s.labels.get("limit")): s.value
            for m in prometheus.limits(data)
            for s in m.samples
        }
        assert metrics[("oncebox_limit_oldest_wait_seconds", "export:concurrency")] == 2400.0
        assert metrics[("oncebox_limit_running", "export:concurrency")] == 1
    finally:
        box.close()


@pytest.mark.slow
def test_a_slot_held_by_a_worker_killed_mid_job_frees_when_its_lease_is_rescued(store_url):
    box = Box(store_url)
    ran: list[int] = []

    @box.task(key="report/{n}", limits=[Concurrency(1)])
    def report(ctx: JobContext, n: int) -> None:
        ran.append(n)

    with FrozenClock(box, at=T0) as clock:
        first = box.enqueue(report, n=1).job_id
        second = box.enqueue(report, n=2).job_id  # (SQLite: the holder will hold the writes)
        inside = SPAWN.Event()
        holder = SPAWN.Process(target=hold_slot, args=(store_url, inside))
        holder.start()
        try:
            assert inside.wait(60), "the holder never reached its handler"
            assert holder.pid is not None
            os.kill(holder.pid, signal.SIGKILL)  # mid-job, its slot leased
            holder.join(30)
        finally:
            if holder.is_alive():
                holder.kill()
        drain(box)
        assert ran == []  # the dead worker's lease still holds the only slot
        clock.advance(timedelta(minutes=10))  # past its lease
        result = drain(box)  # the rescuer ends it; the freed slot takes the next job
        assert sorted(ran) == [1, 2] and result.completed == 2
    attempts = sql(box, "SELECT job_id, outcome FROM oncebox_job_attempts ORDER BY job_id")
    assert attempts == [(first, "lease_expired")]
    assert {row[0] for row in sql(box, "SELECT state FROM oncebox_all_jobs")} == {"done"}
    assert second != first
    box.close()


@pytest.mark.slow
def test_three_worker_processes_lease_a_rate_limited_task_within_its_bucket(store_url):
    """Every window of the leases' own times (the database's clock) holds at most the bucket
    plus what refilled in it: COUNT + COUNT x seconds."""
    setup = rate_box(store_url)
    setup.enqueue_many("call", [{"n": n} for n in range(3 * RATE)])
    workers = [SPAWN.Process(target=work_rated, args=(store_url,)) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    leased = sorted(row[0] for row in sql(setup, "SELECT leased_at FROM oncebox_all_jobs"))
    setup.close()
    assert len(leased) == 3 * RATE
    times = [_instant(value) for value in leased]
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            seconds = (times[j] - start).total_seconds()
            assert j - i + 1 <= RATE + RATE * seconds + 1e-6, (i, j, seconds)
    # and the limit held them back: after the first 20, 40 more need 2 s of refills
    assert (times[-1] - times[0]).total_seconds() >= 2.0 - 0.05


def _instant(value: object) -> datetime:
    """A stored instant: a datetime on PostgreSQL, microseconds since the epoch on SQLite."""
    return value if isinstance(value, datetime) else from_micros(int(value))  # type: ignore[call-overload]


# -- a rolling deploy: releases that disagree about a task's limits share one database ---------


@dataclass(frozen=True)
class Deployed:
    kept: list[str | None]  # the limit keys of the jobs still waiting
    ran_by_old: int  # jobs the old release's worker ran (it knows no limit)
    declared: list[str]  # the tasks the store then knew limited


def deploy_adding_a_limit(url: str) -> Deployed:
    """A rolling deploy that adds `Concurrency(1)` to `export`: a process of the new release
    enqueues three jobs (no worker of the new release has run yet), then a worker of the old
    release, which declares `export` without limits, (re)starts: its lease rescuer's pass,
    then its consumer."""
    new = Box(url)
    try:

        @new.task(name="export", key="export/{n}", limits=[Concurrency(1)])
        def limited(ctx: JobContext, n: int) -> None:
            pass

        for n in range(3):
            new.enqueue(limited, n=n)
    finally:
        new.close()
    ran: list[int] = []
    old = Box(url)
    try:

        @old.task(name="export", key="export/{n}")
        def unlimited(ctx: JobContext, n: int) -> None:
            ran.append(n)

        drain(old)
        kept = [row[0] for row in sql(old, "SELECT limit_key FROM oncebox_all_jobs ORDER BY id")]
        declared = [d.task for d in old.store.limit_declaration_list()]
    finally:
        old.close()
    return Deployed(kept, len(ran), declared)


def test_an_old_release_keeps_the_limit_a_new_release_declared_on_its_jobs(store_url):
    deployed = deploy_adding_a_limit(store_url)
    # waiting for the new workers; the old one, restarted, left the record as it was
    assert deployed == Deployed(["", "", ""], 0, ["export"]), deployed


def test_an_old_release_strips_and_runs_a_new_releases_limited_jobs_without_its_fence(store_url):
    with mutated("unlimit-any-task"):
        deployed = deploy_adding_a_limit(store_url)
    assert deployed.ran_by_old == 3, deployed  # all at once, as far as the limit knew


def test_a_limit_a_deploy_removes_frees_its_jobs_after_the_lapse_and_status_says_when(
    store_url,
):
    """The release that limited `export` enqueued, then was replaced (or rolled back) by one
    without the limit: its jobs wait while the limit may still be declared, are listed by
    `status` once no process declares it, and run when the lapse is over."""
    limiting, unlimited = Box(store_url), Box(store_url)
    ran: list[int] = []
    try:

        @limiting.task(name="export", key="export/{n}", limits=[Concurrency(1)])
        def limited(ctx: JobContext, n: int) -> None:
            pass

        @unlimited.task(name="export", key="export/{n}")
        def export(ctx: JobContext, n: int) -> None:
            ran.append(n)

        with FrozenClock(unlimited, at=T0) as clock:
            for n in range(2):
                limiting.enqueue(limited, n=n)
            clock.advance(timedelta(minutes=1))
            drain(unlimited)
            assert (ran, status_data(unlimited, 1)["quiet_limits"]) == ([], [])
            clock.advance(timedelta(minutes=4))  # no process has declared it for 5 minutes
            drain(unlimited)
            data = status_data(unlimited, 1)
            assert ran == [] and data["quiet_limits"] == [
                {
                    "task": "export",
                    "declared": "export:concurrency 1 at once",
                    "last_declared_at": "2026-08-17T09:00:00Z",
                    "waiting": 2,
                    "waiting_capped": False,
                    "freed_at": "2026-08-17T09:10:00Z",
                }
            ], data["quiet_limits"]
            line = quiet_line(data["quiet_limits"][0], T0 + timedelta(minutes=5))
            assert "no process has declared for 5m" in line and "frees them in 5m" in line, line
            clock.advance(timedelta(minutes=5, seconds=1))
            assert drain(unlimited).completed == 2 and sorted(ran) == [0, 1]
            assert status_data(unlimited, 1)["quiet_limits"] == []
    finally:
        limiting.close()
        unlimited.close()


def test_a_worker_declares_its_codes_limits_when_it_starts(tmp_path: Path):
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")
    try:

        @box.task(key="export/{n}", limits=[Rate("5/s"), Concurrency(2)])
        def export(ctx: JobContext, n: int) -> None:
            pass

        @box.task(key="ping/{n}")
        def ping(ctx: JobContext, n: int) -> None:
            pass

        box.work(until_idle=True)
        [declared] = box.store.limit_declaration_list()
        assert (declared.task, json.loads(declared.limits)) == (
            "export",
            {
                "limits": [["export:concurrency", "2 at once"], ["export:rate:5/s", "5/s"]],
                "partition": None,
            },
        ), declared
    finally:
        box.close()


# -- the limited lease beside another transaction's row lock (PostgreSQL's SKIP LOCKED) -------


@dataclass(frozen=True)
class Spent:
    leased: list[int]  # the lease beside the other transaction's lock
    tokens: float  # the bucket's level it left
    then: list[int]  # the next lease, the lock gone and no time passed


def lease_beside_a_locked_job(url: str) -> Spent:
    """Two jobs of a task limited to two a second, the first locked by another transaction (an
    enqueue merging into it, say) while a lease chooses both and passes over it; then, that
    transaction over and the clock frozen, the next lease."""
    store = open_store(url)
    try:
        store.clock_set(ClockSetting(frozen_at=T0))
        declared = task_limits("t", [Rate("2/s")], None, {"n"})
        assert declared is not None
        limits = plan_of({"t": declared})
        first, second = (insert(store, f"k/{n}", limit_key="") for n in (1, 2))
        with psycopg.connect(url) as other, opened_session(store) as session:
            other.execute("SELECT id FROM oncebox_jobs WHERE id = %s FOR UPDATE", (first,))
            leased = lease(session, limits=limits)[1]
            other.rollback()
            [(tokens,)] = other.execute(
                "SELECT tokens FROM oncebox_limits WHERE name = %s", ("t:rate:2/s",)
            )
            other.rollback()
            then = lease(session, limits=limits)[1]
        assert leased == [second], (leased, first, second)
        return Spent(leased, float(tokens), then)
    finally:
        store.close()


@pytest.mark.postgres
def test_a_limited_lease_spends_tokens_only_on_the_jobs_it_leased(pg_url):
    spent = lease_beside_a_locked_job(pg_url)
    assert spent.tokens == 1.0, spent  # one job leased: one token
    assert len(spent.then) == 1, spent  # the job passed over runs on the token left


@pytest.mark.postgres
def test_a_limited_lease_spends_tokens_on_a_job_it_skipped_without_its_fence(pg_url):
    with mutated("spend-picks"):
        spent = lease_beside_a_locked_job(pg_url)
    assert (spent.tokens, spent.then) == (0.0, []), spent  # charged for both, one ran


def test_an_enqueue_in_the_callers_sqlite_transaction_declares_the_limits_with_its_jobs(
    tmp_path: Path,
):
    """The caller's transaction holds SQLite's write lock: the declaration is written there,
    committed (or rolled back) with the jobs it covers."""
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")
    conn = sqlite3.connect(tmp_path / "o.db")
    try:

        @box.task(key="export/{n}", limits=[Concurrency(1)])
        def export(ctx: JobContext, n: int) -> None:
            pass

        box.enqueue(export, n=1, connection=conn)
        conn.rollback()
        assert box.store.limit_declaration_list() == []
        box.enqueue(export, n=2, connection=conn)
        conn.commit()
        assert [d.task for d in box.store.limit_declaration_list()] == ["export"]
    finally:
        conn.close()
        box.close()
