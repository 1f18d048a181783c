"""A lease and a heartbeat rewrite no index entry on PostgreSQL (issue 47, migration 0024).

PostgreSQL updates a row in place on its page — a HOT update, no new entry in any index — only
when no column an index names (as a key or in its predicate) changed. The jobs table's indexes
select on `stage`, which a lease leaves alone, and the rescuer finds leases by their own rows in
oncebox_job_leases, so the lease of an unlimited job and every heartbeat are HOT. The server's
own per-transaction counters (`pg_stat_xact_user_tables`) say how each update was written.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from oncebox.store import open_store
from oncebox.store.params import JobFinish, JobInsertMany, JobReleaseParams
from oncebox.store.postgres import PostgresConsumerTx, PostgresStore
from oncebox.store.protocol import Store
from support.contract import advance, lease, opened_session

pytestmark = pytest.mark.postgres
ROWS = 2_000
BATCH = 100
JOB_LEASE = {"tasks": ["t"], "queues": ["default"], "worker": "w", "lease_s": 30.0}


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    opened = open_store(pg_url)
    try:
        yield opened
    finally:
        opened.close()


def enqueue(store: Store, rows: int = ROWS, limit_key: str | None = None) -> None:
    jobs = ((f"k/{n}", '{"n": 1}', None, limit_key) for n in range(rows))
    store.job_insert_many(JobInsertMany("t", "default", 0, 3, jobs))


def updates(conn: psycopg.Connection[Any], table: str = "oncebox_jobs") -> tuple[int, int]:
    """(updates, of which HOT) this connection's open transaction made to `table`."""
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = %s",
        (table,),
    ).fetchone()
    assert row is not None, f"no statistics for {table}"
    return row[0], row[1]


def leases(conn: psycopg.Connection[Any]) -> list[tuple[str, list[int]]]:
    return [
        (str(token), list(ids))
        for token, ids in conn.execute(
            "SELECT token, ids FROM oncebox_job_leases ORDER BY expires_at"
        ).fetchall()
    ]


def test_a_lease_of_unlimited_jobs_writes_every_row_in_place(store, pg_url):
    enqueue(store)
    assert isinstance(store, PostgresStore)
    with psycopg.connect(pg_url) as conn:
        conn.execute(store._q["job_lease_settings"])
        token = str(uuid.uuid4())
        leased = conn.execute(store._q["job_lease"], {**JOB_LEASE, "limit": BATCH, "token": token})
        assert len(leased.fetchall()) == BATCH
        assert updates(conn) == (BATCH, BATCH)
        # the lease's own row, with what it took: the rescuer's and the heartbeat's way in
        assert [(t, len(ids)) for t, ids in leases(conn)] == [(token, BATCH)]
        conn.rollback()


# what a lease of an unlimited job and a heartbeat write (job_lease, job_lease_extend)
LEASE_WRITES = {"state", "attempt", "leased_by", "leased_at", "lease_token", "lease_expires_at"}


def test_no_index_of_the_jobs_table_names_a_column_a_lease_or_a_heartbeat_writes(store, pg_url):
    """Whether an update is written in place also depends on room on its page (a heartbeat's
    third version of a row finds it only once the page was pruned); which columns the indexes
    name does not."""
    with psycopg.connect(pg_url) as conn:
        columns = [
            name
            for (name,) in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'oncebox_jobs'::regclass "
                "AND attnum > 0 AND NOT attisdropped"
            )
        ]
        named: dict[str, set[str]] = {}
        for index, definition in conn.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'oncebox_jobs'::regclass"
        ):
            words = set(re.findall(r"[a-z_]+", definition.split(" USING ", 1)[1]))
            named[index] = words & set(columns)
    assert set(LEASE_WRITES) <= set(columns)
    assert {
        index: cols & LEASE_WRITES for index, cols in named.items() if cols & LEASE_WRITES
    } == {}
    assert any("stage" in cols for cols in named.values())  # the indexes select on stage


def test_a_limited_jobs_lease_counts_its_slot_and_is_the_only_lease_not_written_in_place(
    store, pg_url
):
    """The slot index must see a limited job's lease; an unlimited job's leaves it NULL."""
    enqueue(store, rows=10, limit_key="p")
    assert isinstance(store, PostgresStore)
    with psycopg.connect(pg_url) as conn:
        picks = conn.execute(
            "SELECT id, limit_key FROM oncebox_jobs ORDER BY id LIMIT 3"
        ).fetchall()
        conn.execute(
            store._q["job_lease_limited"],
            {
                "picks": Jsonb([[i, p] for i, p in picks]),
                "worker": "w",
                "lease_s": 30.0,
                "token": str(uuid.uuid4()),
            },
        )
        upd, hot = updates(conn)
        assert (upd, hot) == (3, 0)
        slots = conn.execute(store._q["job_limited_leased"], {"counted": ["t"]}).fetchall()
        assert slots == [("t", "p", 3)]
        conn.rollback()


def test_the_statement_that_settles_a_leases_last_job_deletes_the_leases_row(store, pg_url):
    enqueue(store, rows=10)
    with opened_session(store) as session:
        token, ids = lease(session, limit=10)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert leases(conn) == [(token, sorted(ids))]
        first, rest = sorted(ids)[:4], sorted(ids)[4:]
        for part in (first, rest):
            with conn.transaction():
                tx = PostgresConsumerTx(store, conn)
                assert tx.job_finish(token, [JobFinish(i, "done", "completed") for i in part])
            assert leases(conn) == ([] if part is rest else [(token, sorted(ids))])


def test_a_give_back_of_a_leases_last_jobs_deletes_the_leases_row(store, pg_url):
    enqueue(store, rows=5)
    with opened_session(store) as session:
        token, ids = lease(session, limit=5)
        attempt = 1
        session.job_release(
            JobReleaseParams(jobs=[(i, attempt) for i in ids], token=token, delay=timedelta())
        )
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert leases(conn) == []


def test_the_rescuer_frees_a_run_out_leases_jobs_and_deletes_its_row(store, pg_url):
    enqueue(store, rows=5)
    with opened_session(store) as session:
        _token, ids = lease(session, limit=5)
    advance(store, timedelta(hours=1))
    rescued = store.job_rescue_expired(100)
    assert sorted(r.id for r in rescued) == sorted(ids)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert leases(conn) == []
        states = conn.execute("SELECT DISTINCT state FROM oncebox_jobs").fetchall()
        assert states == [("ready",)]


def test_a_lease_of_limited_then_unlimited_jobs_under_one_token_keeps_one_row_with_both(
    store, pg_url
):
    """The consumer leases a limited task's jobs first, then the others, in one transaction."""
    enqueue(store, rows=3, limit_key="p")
    store.job_insert_many(JobInsertMany("u", "default", 0, 3, [("u/1", "{}", None, None)]))
    assert isinstance(store, PostgresStore)
    token = str(uuid.uuid4())
    with psycopg.connect(pg_url) as conn:
        picks = conn.execute("SELECT id, limit_key FROM oncebox_jobs WHERE task = 't'").fetchall()
        common = {"worker": "w", "lease_s": 30.0, "token": token}
        conn.execute(
            store._q["job_lease_limited"],
            {**common, "picks": Jsonb([[i, p] for i, p in picks])},
        )
        unlimited = conn.execute(
            store._q["job_lease"], {**JOB_LEASE, **common, "tasks": ["u"], "limit": 10}
        ).fetchall()
        assert len(unlimited) == 1
        assert [(t, sorted(ids)) for t, ids in leases(conn)] == [
            (token, sorted([i for i, _ in picks] + [unlimited[0][0]]))
        ]
        conn.rollback()
