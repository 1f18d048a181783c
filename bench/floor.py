"""Workload 8, the reference floor: the SQL a job needs, batched, from a minimal psycopg 3 script.

    .venv/bin/python bench/floor.py [--server URL] [--jobs 100000] [--repeat 3]
                                    [--mode noop|full|all] [--json PATH]

What a minimal hand-written client reaches on this machine, so oncebox's figures have a floor to
be read against. Its own three-table schema (not oncebox's), one fresh database per mode and run
(created on the server, dropped after), one sync connection per lane, batches of 100, each batch
one transaction in pipeline mode (two round trips: the claim, then the rest with the commit).
Claims select with `id = ANY(ARRAY(subquery))` rather than `id IN (subquery)`: the same rows, but
the planner always locks the 100 first and then fetches them by primary key, whatever the stats
(with `IN` it can pick a sequential scan and hash join on a freshly analysed small table). The
dispatcher does not let psycopg prepare its statements: a plan cached while the outbox was
nearly empty went on scanning the whole outbox on every lease once it held 100,000 rows,
dropping full_per_s from ~7,000 to ~800; planned afresh, each lease costs under a millisecond.

- noop: N jobs COPYed in (copy_per_s, the raw COPY rate); one connection claims 100 with
  FOR UPDATE SKIP LOCKED and marks them done (noop_per_s), or deletes them (noop_delete_per_s).
- full: the guarantee path. The consumer claims 100, inserts their intents (ON CONFLICT DO
  NOTHING) and one outbox row per fresh intent, marks the jobs done; the dispatcher, concurrently
  on its own connection, leases 100 pending outbox rows, "sends" them to a null provider and
  records the receipts; when it finds nothing it waits for the consumer's next commit, as
  oncebox's dispatcher is woken by the consumer in its process. full_per_s is N / (first
  claim .. last receipt); full_consumer_per_s and full_dispatch_per_s are each lane alone, one
  after the other.

- ours: the same full path, but oncebox's own schema and the very statements its worker sends
  (`src/oncebox/store/sql/postgres/*.sql`, with the parameters built as the store builds
  them: one JSON array per set), still from this minimal script: no handler, no argument
  checks, a constant rendered email per job. ours_per_s (lanes concurrent) and
  ours_consumer_per_s / ours_dispatch_per_s (each alone) split oncebox's gap to the floor in
  two: what its schema and statements cost (the floor ÷ ours), and what its Python costs (ours ÷
  oncebox's worker).

Each figure is the median of `--repeat` runs; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg

from oncebox.store import open_store
from oncebox.store.sqlfiles import load_queries

BATCH = 100
SCHEMA = """
CREATE TABLE jobs (
    id bigserial PRIMARY KEY, key text NOT NULL, args jsonb, state text NOT NULL DEFAULT 'ready',
    run_at timestamptz DEFAULT now(), attempt int DEFAULT 0, lease_token uuid, leased_at timestamptz
);
CREATE INDEX jobs_ready ON jobs (id) WHERE state = 'ready';
CREATE TABLE intents (key text PRIMARY KEY, job_id bigint, claimed_at timestamptz);
CREATE TABLE outbox (
    id bigserial PRIMARY KEY, key text UNIQUE, payload jsonb, state text DEFAULT 'pending',
    receipt text, sent_at timestamptz
);
CREATE INDEX outbox_pending ON outbox (id) WHERE state = 'pending';
"""
CLAIM = f"""UPDATE jobs SET state = 'leased', lease_token = %s, leased_at = now(),
    attempt = attempt + 1
WHERE id = ANY(ARRAY(SELECT id FROM jobs WHERE state = 'ready' ORDER BY id LIMIT {BATCH}
                     FOR UPDATE SKIP LOCKED))
RETURNING id, key"""
DONE = "UPDATE jobs SET state = 'done' WHERE id = ANY(%(ids)s)"
DELETE = "DELETE FROM jobs WHERE id = ANY(%(ids)s)"
INTENTS_AND_OUTBOX = """WITH fresh AS (
    INSERT INTO intents SELECT unnest(%(keys)s::text[]), unnest(%(ids)s::bigint[]), now()
    ON CONFLICT DO NOTHING RETURNING key
)
INSERT INTO outbox (key, payload) SELECT key, jsonb_build_object('key', key) FROM fresh"""
FULL = (INTENTS_AND_OUTBOX, DONE)
LEASE = f"""UPDATE outbox SET state = 'leased'
WHERE id = ANY(ARRAY(SELECT id FROM outbox WHERE state = 'pending' ORDER BY id LIMIT {BATCH}
                     FOR UPDATE SKIP LOCKED))
RETURNING id, key, payload"""
MARK_SENT = """UPDATE outbox SET state = 'sent', receipt = r.receipt, sent_at = now()
FROM unnest(%s::bigint[], %s::text[]) AS r(id, receipt) WHERE outbox.id = r.id"""


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    name = f"floor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        url = psycopg.conninfo.make_conninfo(server, dbname=name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SCHEMA.encode())
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def copy_jobs(url: str, jobs: int) -> float:
    """COPY `jobs` ready jobs into an empty table; returns rows per second."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs, intents, outbox RESTART IDENTITY")
        started = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY jobs (key, args) FROM STDIN") as copy:
            for n in range(jobs):
                copy.write_row((f"floor/{n}", f'{{"n": {n}}}'))
        elapsed = time.perf_counter() - started
        conn.execute("ANALYZE jobs")
    return jobs / elapsed


def consume(
    url: str,
    finish: tuple[str, ...],
    start: threading.Event | None = None,
    written: threading.Event | None = None,
) -> tuple[int, float]:
    """Claim batches until none are ready; `finish` is the SQL run on each batch's ids and keys
    before the commit. Returns (jobs, the perf_counter at the first claim)."""
    done = 0
    with psycopg.connect(url) as conn, conn.pipeline():
        if start is not None:
            start.wait()
        started = time.perf_counter()
        while rows := conn.execute(CLAIM, (uuid.uuid4(),)).fetchall():
            batch = {"ids": [row[0] for row in rows], "keys": [row[1] for row in rows]}
            for sql in finish:
                conn.execute(sql, batch)
            conn.commit()
            if written is not None:
                written.set()
            done += len(rows)
        conn.commit()
    return done, started


def idle(written: threading.Event | None) -> None:
    """Nothing to send yet: wait for the consumer's next commit, as oncebox's dispatcher is woken
    by the consumer in its process (polling every half millisecond instead burnt a core the
    consumer needed)."""
    if written is not None:
        written.wait(0.05)
    else:
        time.sleep(0.0005)


def null_send(key: str, payload: object) -> str:
    """The null provider: accepts everything, returns a receipt."""
    return f"null:{key}"


def dispatch(
    url: str, total: int, consumer_done: threading.Event, written: threading.Event | None = None
) -> tuple[int, float]:
    """Lease, send and record receipts until `total` are sent (or the consumer has finished and
    nothing is pending). Returns (receipts, the perf_counter after the last commit)."""
    sent = 0
    with psycopg.connect(url, prepare_threshold=None) as conn, conn.pipeline():
        while sent < total:
            finished = consumer_done.is_set()
            if written is not None:
                written.clear()
            rows = conn.execute(LEASE).fetchall()
            if not rows:
                conn.commit()
                if finished:
                    break
                idle(written)
                continue
            receipts = [null_send(key, payload) for _, key, payload in rows]
            conn.execute(MARK_SENT, ([row[0] for row in rows], receipts))
            conn.commit()
            sent += len(rows)
    return sent, time.perf_counter()


def check(url: str, query: str, expected: int, what: str) -> None:
    with psycopg.connect(url) as conn:
        row = conn.execute(query.encode()).fetchone()
    if row is None or row[0] != expected:
        raise SystemExit(f"floor: expected {expected} {what}, found {row and row[0]}")


def run_noop(server: str, jobs: int) -> dict[str, float]:
    with fresh_database(server) as url:
        copy_per_s = copy_jobs(url, jobs)
        started = time.perf_counter()
        done, _ = consume(url, (DONE,))
        noop = time.perf_counter() - started
        check(url, "SELECT count(*) FROM jobs WHERE state = 'done'", jobs, "jobs done")
        copy_jobs(url, jobs)
        started = time.perf_counter()
        deleted, _ = consume(url, (DELETE,))
        noop_delete = time.perf_counter() - started
        check(url, "SELECT count(*) FROM jobs", 0, "jobs left after claim-and-delete")
    assert done == deleted == jobs, (done, deleted)
    return {
        "copy_per_s": copy_per_s,
        "noop_per_s": jobs / noop,
        "noop_delete_per_s": jobs / noop_delete,
    }


def check_full(url: str, jobs: int) -> None:
    check(url, "SELECT count(*) FROM jobs WHERE state = 'done'", jobs, "jobs done")
    check(url, "SELECT count(*) FROM intents", jobs, "intents")
    check(url, "SELECT count(*) FROM outbox WHERE state = 'sent'", jobs, "outbox rows sent")


Consume = Callable[[threading.Event, threading.Event], tuple[int, float]]
Dispatch = Callable[[threading.Event, threading.Event], tuple[int, float]]


def lanes_concurrently(
    consume_lane: Consume, dispatch_lane: Dispatch, jobs: int, what: str
) -> float:
    """Both lanes at once, on their own connections: jobs per second from the first claim to the
    last receipt. `consume_lane(start, written)` begins at `start` and sets `written` after each
    commit; `dispatch_lane(consumer_done, written)` waits on `written` when it finds nothing."""
    start, consumer_done, written = threading.Event(), threading.Event(), threading.Event()

    def consumer() -> tuple[int, float]:
        try:
            return consume_lane(start, written)
        finally:
            consumer_done.set()
            written.set()

    with ThreadPoolExecutor(2) as pool:
        dispatched = pool.submit(dispatch_lane, consumer_done, written)
        consumed = pool.submit(consumer)
        start.set()
        (claimed, first_claim), (sent, last_receipt) = consumed.result(), dispatched.result()
    if claimed != jobs or sent != jobs:
        raise SystemExit(f"floor: {what} claimed {claimed} and sent {sent} of {jobs}")
    return jobs / (last_receipt - first_claim)


def lanes_apart(
    consume_lane: Callable[[], object],
    dispatch_lane: Callable[[threading.Event], object],
    jobs: int,
) -> tuple[float, float]:
    """Each lane alone, the consumer first: (consumer jobs/s, dispatcher messages/s)."""
    started = time.perf_counter()
    consume_lane()
    consumer_alone = time.perf_counter() - started
    started, consumer_done = time.perf_counter(), threading.Event()
    consumer_done.set()
    dispatch_lane(consumer_done)
    return jobs / consumer_alone, jobs / (time.perf_counter() - started)


def run_full(server: str, jobs: int) -> dict[str, float]:
    with fresh_database(server) as url:
        copy_jobs(url, jobs)
        full_per_s = lanes_concurrently(
            lambda start, written: consume(url, FULL, start, written),
            lambda done, written: dispatch(url, jobs, done, written),
            jobs,
            "the full path",
        )
        check_full(url, jobs)

        copy_jobs(url, jobs)
        consumer_per_s, dispatch_per_s = lanes_apart(
            lambda: consume(url, FULL), lambda done: dispatch(url, jobs, done), jobs
        )
        check_full(url, jobs)
    return {
        "full_per_s": full_per_s,
        "full_consumer_per_s": consumer_per_s,
        "full_dispatch_per_s": dispatch_per_s,
    }


OURS = load_queries("postgres", "public")
# what the benchmark's handler writes: one rendered email (bench/outbox.py), about 170 bytes
EMAIL = (
    '{{"date": "Tue, 01 Dec 2026 12:00:00 +0000", "from": null, "headers": {{}}, "html": null, '
    '"reply_to": null, "subject": "digest", "text": "hello", "to": ["c{n}@bench.example"]}}'
)


@contextmanager
def oncebox_database(server: str, jobs: int) -> Iterator[str]:
    """A fresh database with oncebox's schema (migrated) and `jobs` ready keyed jobs."""
    name = f"floor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        base = psycopg.conninfo.conninfo_to_dict(server)
        url = f"postgresql://{base.get('host', '127.0.0.1')}:{base.get('port', 5432)}/{name}"
        open_store(url, migrate=True).close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO oncebox_jobs (key, task, queue, args, max_attempts, run_at, "
                "created_at) SELECT 'bench/' || n, 'mail', 'default', jsonb_build_object('n', n), "
                "5, now(), now() FROM generate_series(0, %s - 1) AS n",
                (jobs,),
            )
            conn.execute("ANALYZE")
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def consume_ours(
    url: str, start: threading.Event | None = None, written: threading.Event | None = None
) -> tuple[int, float]:
    """oncebox's consumer, statement for statement: the lease (its own transaction, asynchronous
    commit), then one transaction of claim, outbox rows and settlement."""
    done = 0
    lease = {
        "tasks": ["mail"],
        "queues": ["default"],
        "limit": BATCH,
        "worker": "floor",
        "lease_s": 300.0,
    }
    with psycopg.connect(url) as conn:
        if start is not None:
            start.wait()
        started = time.perf_counter()
        while True:
            token = str(uuid.uuid4())
            with conn.pipeline(), conn.transaction():
                conn.execute(OURS["job_lease_settings"])
                leased = conn.execute(OURS["job_lease"], {**lease, "token": token})
            rows = leased.fetchall()
            if not rows:
                break
            with conn.transaction():
                claims = json.dumps([[r[1], r[2], r[0]] for r in rows])
                claimed = {k for (k,) in conn.execute(OURS["intent_claim"], {"claims": claims})}
                outbox = (
                    "["
                    + ",".join(
                        f'["{r[1]}","{r[1]}","email",{EMAIL.format(n=r[0])},"{token[:32]}",{r[0]}]'
                        for r in rows
                        if r[1] in claimed
                    )
                    + "]"
                )
                conn.execute(OURS["outbox_insert"], {"rows": outbox})
                finishes = json.dumps([[r[0], "done", "completed", 0.0, None] for r in rows])
                conn.execute(OURS["job_finish"], {"token": token, "finishes": finishes})
            if written is not None:
                written.set()
            done += len(rows)
    return done, started


def dispatch_ours(
    url: str, total: int, consumer_done: threading.Event, written: threading.Event | None = None
) -> tuple[int, float]:
    """oncebox's dispatcher, statement for statement: the lease (synchronous commit), the
    channel's pause read, the null provider, the receipts with their delivery attempts."""
    sent = 0
    lease = {"channels": ["email"], "limit": BATCH, "worker": "floor", "lease_s": 300.0}
    with psycopg.connect(url, autocommit=True) as conn:
        while sent < total:
            finished = consumer_done.is_set()
            if written is not None:
                written.clear()
            token = str(uuid.uuid4())
            with conn.pipeline(), conn.transaction():
                conn.execute(OURS["outbox_lease_settings"])
                leased = conn.execute(OURS["outbox_lease"], {**lease, "token": token})
            rows = leased.fetchall()
            if not rows:
                if finished:
                    break
                idle(written)
                continue
            conn.execute(OURS["channel_pause_read"], {"channel": "email"}).fetchall()
            receipts = [null_send(r[1], json.loads(r[4])) for r in rows]
            finishes = json.dumps(
                [
                    [r[0], "sent", "sent", True, 0.0, None, receipt, False, None]
                    for r, receipt in zip(rows, receipts, strict=True)
                ]
            )
            with conn.transaction():
                conn.execute(OURS["outbox_finish"], {"token": token, "finishes": finishes})
            sent += len(rows)
    return sent, time.perf_counter()


def check_ours(url: str, jobs: int) -> None:
    check(url, "SELECT count(*) FROM oncebox_all_jobs WHERE state = 'done'", jobs, "jobs done")
    check(url, "SELECT count(*) FROM oncebox_intents", jobs, "intents")
    check(url, "SELECT count(*) FROM oncebox_outbox WHERE state = 'sent'", jobs, "messages sent")


def run_ours(server: str, jobs: int) -> dict[str, float]:
    with oncebox_database(server, jobs) as url:
        ours_per_s = lanes_concurrently(
            lambda start, written: consume_ours(url, start, written),
            lambda done, written: dispatch_ours(url, jobs, done, written),
            jobs,
            "oncebox's SQL",
        )
        check_ours(url, jobs)
    with oncebox_database(server, jobs) as url:
        consumer_per_s, dispatch_per_s = lanes_apart(
            lambda: consume_ours(url), lambda done: dispatch_ours(url, jobs, done), jobs
        )
        check_ours(url, jobs)
    return {
        "ours_per_s": ours_per_s,
        "ours_consumer_per_s": consumer_per_s,
        "ours_dispatch_per_s": dispatch_per_s,
    }


MODES: dict[str, Callable[[str, int], dict[str, float]]] = {
    "noop": run_noop,
    "full": run_full,
    "ours": run_ours,
}
LABELS = {
    "copy_per_s": "COPY (raw bulk insert)",
    "noop_per_s": "claim 100 + mark done",
    "noop_delete_per_s": "claim 100 + delete",
    "full_per_s": "full path, lanes concurrent",
    "full_consumer_per_s": "full path, consumer alone",
    "full_dispatch_per_s": "full path, dispatcher alone",
    "ours_per_s": "oncebox's SQL, lanes concurrent",
    "ours_consumer_per_s": "oncebox's SQL, consumer alone",
    "ours_dispatch_per_s": "oncebox's SQL, dispatcher alone",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mode", choices=["noop", "full", "ours", "all"], default="all")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    modes = list(MODES) if args.mode == "all" else [args.mode]
    runs: list[dict[str, float]] = []
    for _ in range(args.repeat):
        figures: dict[str, float] = {}
        for mode in modes:
            figures.update(MODES[mode](args.server, args.jobs))
        runs.append(figures)
    medians = {k: round(statistics.median(r[k] for r in runs)) for k in runs[0]}
    print(
        f"reference floor (psycopg {psycopg.__version__}, batch {BATCH}) · {args.jobs} jobs · "
        f"median of {args.repeat} · Python {platform.python_version()} · {platform.machine()}"
    )
    print(f"{'figure':<30}{'per second':>12}")
    for key, value in medians.items():
        print(f"{LABELS[key]:<30}{value:>12,}")
    result = {**medians, "jobs": args.jobs, "repeat": args.repeat}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
