"""Limits on tasks, end to end: declared on the task, checked where declared, rendered at
enqueue, and enforced across worker processes on every store."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from oncebox import Box, Concurrency, ConfigurationError, InvalidKey, JobContext, Rate
from support.db import sql
from support.limits_app import GLOBAL, PER_TENANT, limited_box, read_counts, work_limited

SPAWN = multiprocessing.get_context("spawn")


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"limits": [Concurrency(0)]}, "Concurrency(0) must be within 1..100000"),
        ({"limits": [Concurrency(True)]}, "Concurrency(True) needs an int"),
        ({"limits": [Rate("fast")]}, "rate limit 'fast' is not COUNT/PERIOD"),
        ({"limits": Concurrency(2)}, "limits= must be a list"),
        ({"limits": ["10/s"]}, "'10/s' is not a limit; use oncebox.Concurrency(n)"),
        ({"limits": [Concurrency(2), Concurrency(3)]}, "two limits are both 'job:concurrency'"),
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
        assert sql(box, "SELECT limit_key FROM oncebox_jobs") == [("acme",)]
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
        rows = sql(box, "SELECT task, limit_key FROM oncebox_jobs ORDER BY id")
        assert rows == [("export", "acme"), ("ping", "")]
    finally:
        box.close()
