"""The history of finished jobs (PostgreSQL, migration 0025): a done or cancelled job leaves the
jobs table for a week of `oncebox_job_history` in the statement that settles it; every read finds
it as before; a deployment's finished jobs from before the history move in batches; and the
history's weeks are made ahead, with a late week's rows kept in the default partition."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from oncebox import Box, JobContext, Retry
from oncebox.lanes.pruner import Pruner, PrunerConfig
from oncebox.status import status_data
from oncebox.store.params import JobFilter
from oncebox.testing import FrozenClock, MemoryProvider, drain
from support.db import sql

pytestmark = pytest.mark.postgres
T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)  # a Monday
CODE = Path(__file__).resolve().parent.parent / "src"


def digest_box(url: str) -> Box:
    box = Box(url, seed=3, secret="s" * 32)
    box.channel("email", provider=MemoryProvider())

    @box.task(key="digest/{customer}")
    def digest(ctx: JobContext, customer: int) -> None:
        ctx.outbox.email(to=f"c{customer}@example.com", subject="week", text="hello")

    @box.task(key="poison/{n}", retry=Retry(max_attempts=1))
    def poison(ctx: JobContext, n: int) -> None:
        raise ValueError("bad address")

    return box


def where(box: Box) -> dict[str, list[tuple[str, str]]]:
    """Each table's jobs, as (key, state)."""
    return {
        table: [tuple(r) for r in sql(box, f"SELECT key, state FROM {table} ORDER BY key")]
        for table in ("oncebox_jobs", "oncebox_job_history")
    }


def test_a_done_job_leaves_the_jobs_table_and_every_read_finds_it_in_the_history(pg_url):
    box = digest_box(pg_url)
    try:
        with FrozenClock(box, at=T0):
            box.store.job_history_tend(timedelta(weeks=1), 0)  # as a pruner would by then
            box.enqueue_many("digest", [{"customer": c} for c in range(2)])
            box.enqueue("poison", n=1)
            waiting = box.enqueue("digest", customer=9, delay=timedelta(days=1))
            drain(box, raise_on_failure=False)
            assert where(box) == {
                "oncebox_jobs": [("digest/9", "ready"), ("poison/1", "dead")],
                "oncebox_job_history": [("digest/0", "done"), ("digest/1", "done")],
            }
            [done] = [j for j in box.store.job_find_by_key("digest/0")]
            assert (done.state, done.outcome, done.finished_at) == ("done", "completed", T0)
            assert box.store.job_get(done.id) == done
            listed = box.store.job_list(JobFilter(limit=10))
            assert [j.key for j in listed] == ["digest/9", "poison/1", "digest/1", "digest/0"]
            assert [j.key for j in box.store.job_list(JobFilter(state="done", limit=10))] == [
                "digest/1",
                "digest/0",
            ]
            assert box.store.job_count_by_state().counts["done"] == 2
            # a finished job's week: the partition of the Monday it finished in
            [(week,)] = sql(
                box,
                "SELECT tableoid::regclass::text FROM oncebox_job_history WHERE key = 'digest/0'",
            )
            assert week.endswith("oncebox_job_history_20260817")
            assert waiting.job_id is not None
            assert box.cancel(waiting.job_id, reason="not needed").id == waiting.job_id
            assert ("digest/9", "cancelled") in where(box)["oncebox_job_history"]
    finally:
        box.close()


def test_a_key_whose_job_is_done_is_refused_by_its_intent_and_a_dead_ones_by_the_jobs_table(
    pg_url,
):
    box = digest_box(pg_url)
    try:
        box.enqueue("digest", customer=1)
        box.enqueue("poison", n=1)
        drain(box, raise_on_failure=False)
        assert not box.enqueue("digest", customer=1).created  # the intent holds the key
        assert not box.enqueue("poison", n=1).created  # the dead job, in the jobs table
        assert [k for k, _ in where(box)["oncebox_job_history"]] == ["digest/1"]
    finally:
        box.close()


def test_a_week_not_made_in_time_keeps_its_rows_in_the_default_partition_until_it_is(pg_url):
    box = digest_box(pg_url)
    try:
        late = T0 + timedelta(weeks=10)  # past the four weeks the migration made ahead
        with FrozenClock(box, at=late):
            box.enqueue("digest", customer=1)
            drain(box)
            [(part,)] = sql(box, "SELECT tableoid::regclass::text FROM oncebox_job_history")
            assert part.endswith("oncebox_job_history_default")
            tended = box.store.job_history_tend(timedelta(weeks=4), 100)
            assert tended.made and tended.made >= 1
            [(part,)] = sql(box, "SELECT tableoid::regclass::text FROM oncebox_job_history")
            assert part.endswith("oncebox_job_history_20261026")
            assert sql(box, "SELECT count(*) FROM oncebox_job_history_default") == [(0,)]
    finally:
        box.close()


OLD_DONE = """
INSERT INTO oncebox_jobs (key, task, queue, args, state, outcome, max_attempts, attempt, run_at,
                          created_at, finished_at)
SELECT 'old/' || g, 'digest', 'default', '{"customer": 0}', 'done', 'completed', 3, 1,
       now() - interval '1 day', now() - interval '1 day', now() - make_interval(hours => g)
FROM generate_series(1, %(n)s) g
"""


def older_release_left(url: str, n: int) -> None:
    """Done jobs in the jobs table, as a database from before migration 0025 holds them."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(OLD_DONE, {"n": n})  # within retention: the pruner keeps them


def test_the_pruner_moves_the_finished_jobs_of_an_older_release_a_batch_a_pass(pg_url):
    box = digest_box(pg_url)
    try:
        older_release_left(pg_url, 25)
        pruner = Pruner.for_runtime(box.runtime, PrunerConfig(batch_size=10))
        passes = [pruner.run_once() for _ in range(4)]
        assert [p.moved for p in passes] == [10, 10, 5, 0]
        assert [p.full for p in passes][:2] == [True, True]
        assert where(box)["oncebox_jobs"] == []
        assert len(where(box)["oncebox_job_history"]) == 25
        assert len(box.store.job_list(JobFilter(state="done", limit=100))) == 25
    finally:
        box.close()


def migrate(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(CODE)}
    return subprocess.run(
        [sys.executable, "-m", "oncebox.cli", "migrate", "--db", url, *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_migrate_says_what_waits_to_move_and_moves_it_with_move_history(pg_url):
    Box(pg_url).close()  # migrated
    older_release_left(pg_url, 12)
    said = migrate(pg_url)
    assert said.returncode == 0, said.stderr
    assert "finished jobs from before the history wait to move into it (12)" in said.stdout
    assert "oncebox migrate --move-history" in said.stdout
    moved = migrate(pg_url, "--move-history")
    assert moved.returncode == 0, moved.stderr
    assert "moved 12 finished jobs into the history" in moved.stdout
    again = migrate(pg_url, "--move-history")  # nothing left: says so, moves nothing
    assert "moved 0 finished jobs" in again.stdout and again.returncode == 0
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM oncebox_job_history").fetchone() == (12,)
        assert conn.execute("SELECT count(*) FROM oncebox_jobs").fetchone() == (0,)


def weeks(box: Box) -> list[str]:
    return [
        name
        for (name,) in sql(
            box,
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'oncebox_job_history'::regclass ORDER BY 1",
        )
    ]


def test_a_week_past_every_tasks_retention_goes_whole_with_what_it_counted_folded(pg_url):
    box = digest_box(pg_url)
    try:
        with FrozenClock(box, at=T0) as clock:
            box.store.job_history_tend(timedelta(weeks=1), 0)
            box.enqueue_many("digest", [{"customer": c} for c in range(3)])
            drain(box)
            assert "oncebox_job_history_20260817" in weeks(box)
            pruner = Pruner.for_runtime(box.runtime, PrunerConfig())
            # the week ends Monday 24 August 00:00 UTC (T0 is its Monday, 09:00): kept 14 days
            # from its end, not from each job's finish (job_prune's cutoff, by week)
            clock.advance(timedelta(days=21) - timedelta(hours=10))
            assert pruner.run_once().pruned["jobs"] == 0
            assert "oncebox_job_history_20260817" in weeks(box)
            clock.advance(timedelta(hours=2))
            passed = pruner.run_once()
            assert passed.pruned["jobs"] == 3 and passed.full
            assert "oncebox_job_history_20260817" not in weeks(box)
            assert box.store.counter_list()["pruned_jobs"] == 3
            assert "done" not in box.store.job_count_by_state().counts  # the depths folded
            assert box.store.job_list(JobFilter(limit=10)) == []
    finally:
        box.close()


def test_a_week_holding_a_job_kept_for_ever_or_an_unsent_message_stays(pg_url):
    box = digest_box(pg_url)

    @box.task(key="invoice/{n}", keep_jobs=timedelta.max)
    def invoice(ctx: JobContext, n: int) -> None:
        pass

    try:
        with FrozenClock(box, at=T0) as clock:
            box.store.job_history_tend(timedelta(weeks=1), 0)
            box.enqueue("digest", customer=1)
            box.enqueue("invoice", n=1)
            drain(box)
            clock.advance(timedelta(days=60))
            pruner = Pruner.for_runtime(box.runtime, PrunerConfig())
            assert box.store.job_history_drop({"invoice": None}, timedelta(days=14)) == 0
            pruner.run_once()  # the digest goes by its batch, the invoice stays
            assert "oncebox_job_history_20260817" in weeks(box)
            assert [k for k, _ in where(box)["oncebox_job_history"]] == ["invoice/1"]
    finally:
        box.close()
    box = digest_box(pg_url)  # the week after: a digest whose email is still to send
    try:
        with FrozenClock(box, at=T0 + timedelta(weeks=1)) as clock:
            box.store.job_history_tend(timedelta(weeks=1), 0)
            box.enqueue("digest", customer=2)
            drain(box, dispatch=False)  # done, its email pending
            clock.advance(timedelta(days=60))
            kept = {"invoice": None}  # the week before holds an invoice kept for ever
            assert box.store.job_history_drop(kept, timedelta(days=14)) == 0
            assert "oncebox_job_history_20260824" in weeks(box)
            drain(box)  # sent
            assert box.store.job_history_drop(kept, timedelta(days=14)) == 1  # past the kept one
            assert "oncebox_job_history_20260824" not in weeks(box)
            assert "oncebox_job_history_20260817" in weeks(box)
    finally:
        box.close()


BACK_TO_THE_JOBS_TABLE = """
WITH back AS (DELETE FROM oncebox_job_history RETURNING *)
INSERT INTO oncebox_jobs
    (id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
     attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
     last_error, schedule, period, trace_context, limit_key)
SELECT id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
       attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
       last_error, schedule, period, trace_context, limit_key
FROM back
"""


def reads(box: Box) -> dict[str, Any]:
    """What operators read of the jobs: listings, a key's jobs, each job, the counts, status."""
    listed = {
        state: box.store.job_list(JobFilter(state=state, limit=100))
        for state in (None, "ready", "done", "dead", "cancelled")
    }
    keys = sorted({j.key for j in listed[None] if j.key})
    status = status_data(box, 2)
    return {
        "listed": listed,
        "by_prefix": box.store.job_list(JobFilter(key_prefix="digest/", limit=100)),
        "by_key": {key: box.store.job_find_by_key(key) for key in keys},
        "by_id": {j.id: box.store.job_get(j.id) for j in listed[None]},
        "attempts": {j.id: box.store.job_attempt_list(j.id) for j in listed[None]},
        "counts": box.store.job_count_by_state().counts,
        "status": {k: status[k] for k in ("jobs", "backlog") if k in status},
    }


def test_every_read_is_the_same_whether_finished_jobs_are_in_the_jobs_table_or_the_history(
    pg_url,
):
    """The same workload read three ways: as this release leaves it, as an older release left
    it (every finished job in the jobs table), and once the move put them back in the history."""
    box = digest_box(pg_url)
    try:
        with FrozenClock(box, at=T0) as clock:
            box.store.job_history_tend(timedelta(weeks=1), 0)
            box.enqueue_many("digest", [{"customer": c} for c in range(4)])
            box.enqueue_many("poison", [{"n": n} for n in range(3)])
            later = box.enqueue("digest", customer=9, delay=timedelta(days=2))
            drain(box, raise_on_failure=False)
            clock.advance(timedelta(hours=1))
            box.replay("poison/0", reason="fixed the address")
            box.discard_dead("poison/1", reason="customer left")
            assert later.job_id is not None
            box.cancel(later.job_id, reason="not needed")
            drain(box, raise_on_failure=False, dispatch=False)  # poison/0 dies again
            box.enqueue("digest", customer=10)  # waits
            now = reads(box)
            states = {j.state for j in now["listed"][None]}
            assert states == {"ready", "done", "dead", "cancelled"}
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(BACK_TO_THE_JOBS_TABLE)
            assert where(box)["oncebox_job_history"] == []
            assert reads(box) == now  # as an older release's rows
            box.store.job_history_tend(timedelta(weeks=1), 100)
            assert where(box)["oncebox_jobs"] == [
                ("digest/10", "ready"),
                ("poison/0", "dead"),
                ("poison/2", "dead"),
            ]
            assert reads(box) == now  # moved
    finally:
        box.close()
