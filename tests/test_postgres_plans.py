"""Statements whose cost must not depend on what the planner believes about a table's size.

A lease picks its rows through an index and a settlement names them by id. On a table the
planner believed small (a few thousand rows, freshly analysed) it used to read the whole table
instead to find them again for the update — for a settlement matching every row against every
element of the batch's JSON, extracting the id again for each pair: O(table x batch) per
statement, and the most expensive statement of the full guarantee path in
`bench/statements.py`; for a lease at a trickle, a third of its time. The server's own
per-transaction counters (`pg_stat_xact_user_tables`) say which way a statement read a table.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from oncebox.outbox.transitions import OutboxFinish
from oncebox.store import open_store
from oncebox.store.params import InsertRow, JobFilter, JobFinish, JobInsertMany, OutboxFilter
from oncebox.store.postgres import PostgresConsumerTx, PostgresStore
from oncebox.store.protocol import Store
from support.contract import lease, lease_outbox, opened_session, outbox_insert

pytestmark = pytest.mark.postgres
ROWS = 2_000  # small enough that reading the whole table looks cheaper to the planner
BATCH = 100


@pytest.fixture
def store(pg_url: str) -> Iterator[Store]:
    opened = open_store(pg_url)
    try:
        yield opened
    finally:
        opened.close()


@contextmanager
def counted(url: str, table: str) -> Iterator[tuple[psycopg.Connection[Any], dict[str, int]]]:
    """A connection whose transaction's reads of `table` are counted into the dict on exit,
    then rolled back."""
    reads: dict[str, int] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn, reads
        row = conn.execute(
            "SELECT seq_scan, seq_tup_read, idx_scan, idx_tup_fetch FROM pg_stat_xact_user_tables "
            "WHERE relname = %s",
            (table,),
        ).fetchone()
        assert row is not None, f"no statistics for {table}"
        reads.update(seq_scan=row[0], seq_tup_read=row[1], idx_scan=row[2], idx_tup_fetch=row[3])
        conn.rollback()


# the parameters the store binds (store/postgres.py: job_lease, outbox_lease)
JOB_LEASE = {"tasks": ["t"], "queues": ["default"], "worker": "w", "lease_s": 30.0}
OUTBOX_LEASE = {"channels": ["email"], "worker": "d", "lease_s": 30.0}


def run_lease(store: Store, conn: psycopg.Connection[Any], name: str, params: dict[str, Any]):
    """A lease statement of the store's, with its settings, in the counted transaction (the
    store's own lease commits, and its connection's counters are not this test's to read)."""
    assert isinstance(store, PostgresStore)
    conn.execute("BEGIN")
    conn.execute(store._q[f"{name}_settings"])
    return conn.execute(store._q[name], {**params, "token": str(uuid.uuid4())}).fetchall()


def analyse(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def test_leasing_jobs_reads_them_through_indexes_not_the_whole_table(store, pg_url):
    rows = ((f"k/{n}", '{"n": 1}', None, None) for n in range(ROWS))
    store.job_insert_many(JobInsertMany("t", "default", 0, 3, rows))
    analyse(pg_url)
    assert isinstance(store, PostgresStore)
    for limit in (1, BATCH):  # a trickle's pick-up and a batch
        with counted(pg_url, "oncebox_jobs") as (conn, reads):
            leased = run_lease(store, conn, "job_lease", {**JOB_LEASE, "limit": limit})
        assert len(leased) == limit
        assert reads["seq_scan"] == 0, (limit, reads)


def test_settling_a_batch_of_jobs_reads_them_by_id_not_the_whole_table(store, pg_url):
    rows = ((f"k/{n}", '{"n": 1}', None, None) for n in range(ROWS))
    store.job_insert_many(JobInsertMany("t", "default", 0, 3, rows))
    analyse(pg_url)
    with opened_session(store) as session:
        token, ids = lease(session, limit=BATCH)
    assert len(ids) == BATCH
    assert isinstance(store, PostgresStore)
    with counted(pg_url, "oncebox_jobs") as (conn, reads):
        tx = PostgresConsumerTx(store, conn)
        settled = tx.job_finish(token, [JobFinish(i, "done", "completed") for i in ids])
    assert settled == set(ids)
    assert reads["seq_scan"] == 0, reads
    assert reads["idx_scan"] >= 1, reads


def test_leasing_messages_reads_them_through_indexes_not_the_whole_outbox(store, pg_url):
    with opened_session(store) as session, session.transaction() as tx:
        tx.outbox_insert([outbox_insert(f"m/{n}") for n in range(ROWS)])
    analyse(pg_url)
    for limit in (1, BATCH):
        with counted(pg_url, "oncebox_outbox") as (conn, reads):
            leased = run_lease(store, conn, "outbox_lease", {**OUTBOX_LEASE, "limit": limit})
        assert len(leased) == limit
        assert reads["seq_scan"] == 0, (limit, reads)


def test_settling_a_batch_of_messages_reads_them_by_id_not_the_whole_outbox(store, pg_url):
    with opened_session(store) as session, session.transaction() as tx:
        tx.outbox_insert([outbox_insert(f"m/{n}") for n in range(ROWS)])
    analyse(pg_url)
    leased = lease_outbox(store, limit=BATCH)
    assert len(leased) == BATCH
    token = leased[0].lease_token
    assert isinstance(store, PostgresStore)
    finishes = [OutboxFinish(m.id, "sent", "sent", True, receipt=f"r/{m.id}") for m in leased]
    with counted(pg_url, "oncebox_outbox") as (conn, reads):
        conn.execute("BEGIN")
        settled = store._finish_outbox(conn, token, finishes)
    assert settled == {m.id for m in leased}
    assert reads["seq_scan"] == 0, reads
    assert reads["idx_scan"] >= 1, reads


def test_listing_filtered_dead_letters_reads_the_dead_rows_indexes_not_the_whole_tables(
    store, pg_url
):
    """The dead-letter filters (`dlq list`, a replay's dry run) run in the listing statements;
    dead jobs are read through oncebox_jobs_dead and dead messages through
    oncebox_outbox_attention, however many rows are not dead."""
    rows = ((f"k/{n}", '{"n": 1}', None, None) for n in range(ROWS))
    store.job_insert_many(JobInsertMany("t", "default", 0, 3, rows))
    with opened_session(store) as session:
        token, ids = lease(session, limit=3)
        with session.transaction() as tx:
            tx.job_finish(token, [JobFinish(i, "dead", error="SMTP 550") for i in ids])
    with opened_session(store) as session, session.transaction() as tx:
        tx.outbox_insert([outbox_insert(f"m/{n}") for n in range(ROWS)])
    leased = lease_outbox(store, limit=2)
    finishes = [OutboxFinish(m.id, "dead", "dead", True, error="SMTP 550") for m in leased]
    store.outbox_finish(leased[0].lease_token, finishes)
    analyse(pg_url)
    assert isinstance(store, PostgresStore)
    older, newer = timedelta(0), timedelta(hours=1)
    jobs = JobFilter(state="dead", error="smtp", older_than=older, newer_than=newer, limit=501)
    messages = OutboxFilter(
        state="dead", error="smtp", older_than=older, newer_than=newer, limit=501
    )
    for table, name, where in (
        ("oncebox_jobs", "job_list", jobs),
        ("oncebox_outbox", "outbox_list", messages),
    ):
        with counted(pg_url, table) as (conn, reads):
            found = conn.execute(store._q[name], store._listing(where)).fetchall()
        assert len(found) == (3 if name == "job_list" else 2), (name, found)
        assert reads["seq_scan"] == 0, (name, reads)


def test_pruning_reads_through_indexes_never_a_whole_table(store, pg_url):
    """Retention's batches walk their index (0014) and probe the other table by key: a batch
    that read the whole outbox to check its jobs' messages cost 215 ms at 500 000 messages
    (bench/retention.py), and would grow with the table."""
    rows = ((f"k/{n}", '{"n": 1}', None, None) for n in range(ROWS))
    store.job_insert_many(JobInsertMany("t", "default", 0, 3, rows))
    with opened_session(store) as session:
        for _ in range(ROWS // BATCH):  # every job done: the history holds them (0025)
            token, ids = lease(session, limit=BATCH)
            with session.transaction() as tx:
                tx.job_finish(token, [JobFinish(i, "done", "completed") for i in ids])
    with opened_session(store) as session, session.transaction() as tx:
        tx.outbox_insert([outbox_insert(f"m/{n}") for n in range(ROWS)])
    for _ in range(ROWS // BATCH):  # every message sent, each with its attempt
        leased = lease_outbox(store, limit=BATCH)
        finishes = [OutboxFinish(m.id, "sent", "sent", True, receipt="r") for m in leased]
        store.outbox_finish(leased[0].lease_token, finishes)
    analyse(pg_url)
    assert isinstance(store, PostgresStore)
    # the statement, the parameters the store binds (a cut-off in the future: everything
    # finished is past it), and what it must find
    batches = [
        ("job_prune", {"task": "t"}, BATCH),
        ("outbox_prune", {"channel": "email"}, BATCH),
        ("outbox_payload_drop", {"channel": "email"}, BATCH),
        ("delivery_attempt_prune", {}, BATCH),
    ]
    for name, params, expected in batches:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("BEGIN")
            done = conn.execute(
                store._q[name], {**params, "older_than_s": -8 * 86400.0, "limit": BATCH}
            ).fetchall()
            # a seq scan that read no row is the planner probing an empty week of the history
            # (0025): the rows a scan read say whether it read a table through
            reads = conn.execute(
                "SELECT relname, seq_tup_read FROM pg_stat_xact_user_tables "
                "WHERE relname IN ('oncebox_jobs', 'oncebox_outbox', "
                "'oncebox_delivery_attempts') OR relname LIKE 'oncebox\\_job\\_history%%'"
            ).fetchall()
            conn.rollback()
        assert len(done) == expected, name
        assert [table for table, read in reads if read] == [], (name, reads)


LIMITED = 10_000  # jobs per partition held back by a saturated limit


def test_a_saturated_limited_backlog_costs_the_leases_a_probe_per_partition_not_a_scan(
    store, pg_url
):
    """The unlimited lease never steps over limited jobs (they are not in its index), and the
    limited lease's survey finds each partition with one probe, whatever waits in it."""
    for partition in ("a", "b"):
        held: Iterator[InsertRow] = ((None, '{"n": 1}', None, partition) for _ in range(LIMITED))
        store.job_insert_many(JobInsertMany("t", "default", 5, 3, held))
    free: Iterator[InsertRow] = ((f"u/{n}", '{"n": 1}', None, None) for n in range(10))
    store.job_insert_many(JobInsertMany("u", "default", 0, 3, free))
    analyse(pg_url)
    assert isinstance(store, PostgresStore)
    with counted(pg_url, "oncebox_jobs") as (conn, reads):
        leased = run_lease(store, conn, "job_lease", {**JOB_LEASE, "tasks": ["t", "u"], "limit": 5})
    assert len(leased) == 5  # the unlimited task's, the limited backlog ahead of them unread
    assert reads["seq_scan"] == 0 and reads["idx_tup_fetch"] < 50, reads
    survey = {"tasks": ["t"], "rates": [], "counted": ["t"], "names": ["t:concurrency"]}
    with counted(pg_url, "oncebox_jobs") as (conn, reads):
        conn.execute("BEGIN")
        conn.execute(store._q["job_lease_settings"])
        for name in ("job_limited_partitions", "job_limited_leased", "job_limited_next_due"):
            conn.execute(store._q[name], survey).fetchall()
        asks = json.dumps([["t", "a", 1], ["t", "b", 1]])
        found = conn.execute(
            store._q["job_limited_candidates"], {"asks": asks, "queues": ["default"]}
        ).fetchall()
        waiting = conn.execute(
            store._q["job_limited_waiting"], {**survey, "cap": 101, "partitions": 1000}
        ).fetchall()
    assert len(found) == 2 and sorted(row[2] for row in waiting) == [101, 101]
    assert reads["seq_scan"] == 0 and reads["idx_tup_fetch"] < 300, reads
