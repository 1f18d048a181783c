"""Schema rules: numbered additive migrations, the version check at worker start."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from oncebox import Box, SchemaError
from oncebox.store import open_store
from oncebox.store.sqlfiles import load_migrations
from support.db import sql
from support.depths import depth_drift


def _with_task(box: Box) -> Box:
    @box.task(key="k/{n}")
    def task(ctx, n: int) -> None:
        pass

    return box


def test_sqlite_is_migrated_when_opened_and_migrating_again_is_a_no_op(sqlite_url):
    store = open_store(sqlite_url)
    try:
        status = store.schema_status()
        assert status.missing == () and status.current == status.required >= 1
        assert store.schema_migrate() == []
    finally:
        store.close()


def test_a_worker_refuses_a_database_older_than_it_needs(sqlite_url):
    open_store(sqlite_url, migrate=False).close()  # an empty file, never migrated
    store = open_store(sqlite_url, migrate=False)
    box = _with_task(Box(store=store))
    try:
        with pytest.raises(SchemaError, match=r"schema version 0; .* run `oncebox migrate`"):
            box.work(until_idle=True)
    finally:
        box.close()


def test_a_worker_runs_with_a_warning_on_a_newer_additive_schema(store_url, caplog):
    box = _with_task(Box(store_url))
    try:
        now = "0" if box.store.dialect == "sqlite" else "now()"
        sql(
            box,
            "INSERT INTO oncebox_migrations (version, name, checksum, applied_at) "
            f"VALUES (99, 'from_the_future', 'x', {now})",
        )
        box.enqueue("task", n=1)
        with caplog.at_level(logging.WARNING, logger="oncebox.schema"):
            result = box.work(until_idle=True)
        assert result.consumed.completed == 1
        assert "migrations this oncebox does not know (99)" in caplog.text
    finally:
        box.close()


@pytest.mark.postgres
def test_postgres_is_not_migrated_implicitly_and_the_worker_says_what_to_run(pg_url):
    box = _with_task(Box(f"{pg_url}?schema=not_migrated"))
    try:
        with pytest.raises(SchemaError, match="run `oncebox migrate`"):
            box.work(until_idle=True)
    finally:
        box.close()


@pytest.mark.postgres
def test_concurrent_migrations_apply_each_version_once(pg_url):
    url = f"{pg_url}?schema=raced"
    applied: list[list[int]] = []

    def migrate() -> None:
        store = open_store(url)
        try:
            applied.append(store.schema_migrate())
        finally:
            store.close()

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    known = len(load_migrations("postgres"))
    assert sorted(map(len, applied)) == [0, 0, 0, known]


@pytest.mark.postgres
def test_a_migration_blocked_by_a_long_transaction_gives_up_and_applies_nothing(
    pg_url, monkeypatch
):
    """A migration queued behind a busy table would hold every worker's query behind it: it gives
    up after the lock timeout, says so, and leaves the schema as it was."""
    import psycopg

    from oncebox.store import postgres

    with psycopg.connect(pg_url, autocommit=True) as admin:
        # take the schema back to before 0004, as an older deployment left it
        admin.execute("DROP TABLE public.oncebox_key_canaries")
        admin.execute("DROP INDEX public.oncebox_outbox_job")
        admin.execute("DROP VIEW public.oncebox_all_jobs")  # (0025) names the two columns
        admin.execute("ALTER TABLE public.oncebox_jobs DROP COLUMN schedule, DROP COLUMN period")
        admin.execute("DELETE FROM public.oncebox_migrations WHERE version = 4")
        with psycopg.connect(pg_url) as reader:
            reader.execute("SELECT count(*) FROM public.oncebox_jobs")  # ACCESS SHARE, held
            monkeypatch.setattr(postgres, "MIGRATION_LOCK_TIMEOUT_MS", 200)
            store = open_store(pg_url, migrate=False)
            try:
                with pytest.raises(SchemaError, match=r"migration 4 .* could not lock its tables"):
                    store.schema_migrate()
                assert store.schema_status().missing == (4,)
            finally:
                store.close()
            reader.rollback()
        columns = admin.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = 'oncebox_jobs' "
            "AND column_name = 'period'"
        ).fetchone()
        assert columns == (0,)
    store = open_store(pg_url, migrate=False)
    try:
        assert store.schema_migrate() == [4]
    finally:
        store.close()


@pytest.mark.parametrize(
    "dialect", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_depths_migration_counts_the_rows_a_database_already_holds(request, dialect):
    """A database upgraded with jobs and messages in it: migration 10 starts the depths from a
    count of what is there, so status reads the same figures before and after."""
    if dialect == "sqlite":
        url = request.getfixturevalue("sqlite_url")
    else:
        url = f"{request.getfixturevalue('pg_url')}?schema=depths_upgrade"
    store: Any = open_store(url, migrate=False)
    known = store._migrations  # the migrations of the release before the depths
    store._migrations = lambda: [m for m in known() if m.version < 10]
    store.schema_migrate()
    box = _with_task(Box(store=store))
    try:
        # seven jobs as that release wrote them: today's enqueue names later migrations' columns
        now, jobs = ("0", "") if dialect == "sqlite" else ("now()", "depths_upgrade.")
        for n in range(7):
            sql(
                box,
                f"INSERT INTO {jobs}oncebox_jobs (key, task, queue, args, max_attempts, run_at, "
                f"created_at) VALUES (?, 'task', 'default', ?, 3, {now}, {now})",
                (f"k/{n}", f'{{"n": {n}}}'),
            )
        del store._migrations  # every migration again
        assert store.schema_migrate() == [10, *range(11, len(known()) + 1)]
        assert depth_drift(url) == {}
        assert store.job_count_by_state().counts == {"ready": 7}
        box.enqueue_many("task", [{"n": n} for n in range(7, 9)])  # and kept from then on
        assert store.job_count_by_state().counts == {"ready": 9}
    finally:
        box.close()
