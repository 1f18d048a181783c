"""Retention under load: the pruner removes a backlog of prunable rows while a worker works.

    .venv/bin/python bench/retention.py [--rows 10000000] [--measure 20000] [--rounds 3]
                                        [--postgres URL] [--json PATH]

On a fresh PostgreSQL database, `--rows` prunable rows are loaded by `INSERT ... SELECT
generate_series`, as months of a weekly digest leave them: half done jobs that finished 30 days
ago, in the history of finished jobs (`oncebox_job_history`, in the partition of the week they
finished in, made first as a running pruner makes weeks ahead; with the weeks up to four weeks
ahead, where the measured jobs finish), half the sent messages they wrote 100 days ago (a ~1 KB
rendered digest each, with its one delivery attempt), then the indexes are in place and the
tables analysed, as autovacuum would have them. Then:

1. **baseline**: `--rounds` times, `--measure` keyed no-op jobs are enqueued and one worker drains
   them (`box.work(until_idle=True)`, default settings; its own pruner has nothing to do);
2. **while pruning**: the pruner lane starts in a process of its own — the same `Pruner` a worker
   runs, default policy (jobs 14 days, messages 90 days), batches of 1 000, paced at its default
   duty (`--duty`) — and the same measurement is repeated every `--gap` seconds until the pruner
   has removed every row past its retention: the jobs' week dropped whole
   (`Store.job_history_drop`, as the pruner does once a week is past retention), the messages
   and their attempts by batched DELETE;

In both phases a thread does what a production server's autovacuum would (this benchmark's
server runs without it): once a minute, each table past its own thresholds is vacuumed.
3. the tables' and their indexes' sizes are read before the prune, right after it, and after a
   plain `VACUUM` (the deploy guide explains why the files do not shrink).

Reported: jobs/s in each phase (median of the rounds) and their ratio (the pruner's cost to the
workers: within the noise is the target), rows pruned per second (jobs and messages; each
message's delivery attempt goes with it), and the sizes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import analyse, postgres_url

import oncebox
from oncebox import Box, Retention, WorkerConfig
from oncebox.lanes.pruner import Pruner, PrunerConfig, plan_for

PAYLOAD = json.dumps(
    {
        "to": ["customer@freight.example"],
        "subject": "Your shipments this week",
        "text": "Hello, here are your shipments. " * 30,
        "from": "digest@oncebox.example",
        "date": "Mon, 17 Aug 2026 09:00:00 +0000",
    }
)
# the history's weeks, from the load's to four weeks ahead (the pruner's HISTORY_AHEAD): made
# before the load, as a running pruner would have made them, so no row waits in the default
# partition for the pruner's first pass to move it
LOAD_WEEKS = """
SELECT oncebox_job_history_weeks(now() - interval '31 days', now() + interval '28 days')
"""
# a finished job lives in the history (0025); its id is drawn where the jobs table's are
LOAD_JOBS = """
INSERT INTO oncebox_job_history (id, key, task, queue, args, state, outcome, priority, attempt,
                                 max_attempts, attempt_base, run_at, created_at, finished_at)
SELECT nextval(pg_get_serial_sequence('oncebox_jobs', 'id')),
       'weekly-digest/customer-' || n || '/2026-W30', 'weekly_digest', 'default',
       jsonb_build_object('customer', n), 'done', 'completed', 0, 1, 8, 0,
       now() - interval '31 days', now() - interval '31 days',
       now() - interval '30 days' + make_interval(secs => n * 0.0001)
FROM generate_series(1, %(count)s) AS n
"""
LOAD_MESSAGES = """
INSERT INTO oncebox_outbox (key, intent_key, channel, payload, token, job_id, state, attempt,
                            next_attempt_at, created_at, sent_at, receipt)
SELECT 'weekly-digest/customer-' || n || '/2026-W20', 'weekly-digest/customer-' || n ||
       '/2026-W20', 'email', %(payload)s::jsonb, md5(n::text), NULL, 'sent', 1,
       now() - interval '100 days', now() - interval '100 days',
       now() - interval '100 days' + make_interval(secs => n * 0.0001), 'r-' || n
FROM generate_series(1, %(count)s) AS n
"""
LOAD_ATTEMPTS = """
INSERT INTO oncebox_delivery_attempts (outbox_id, attempt, finished_at, outcome, receipt)
SELECT id, 1, sent_at, 'sent', receipt FROM oncebox_outbox
"""
TABLES = ("oncebox_jobs", "oncebox_job_history", "oncebox_outbox", "oncebox_delivery_attempts")
QUIET = Retention(jobs=None, payloads=None, messages=None, delivery_attempts=None, audit=None)


def load(url: str, rows: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute(LOAD_WEEKS.encode())
        conn.execute(LOAD_JOBS.encode(), {"count": rows // 2})
        conn.execute(LOAD_MESSAGES.encode(), {"count": rows - rows // 2, "payload": PAYLOAD})
        conn.execute(LOAD_ATTEMPTS.encode())
    analyse(url)
    return time.perf_counter() - started


def sizes(url: str) -> dict[str, dict[str, int]]:
    """Each table's bytes, its indexes' and its rows; a partitioned table's (the history) summed
    over its partitions (its parent holds none)."""
    found = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES:
            row = conn.execute(
                "SELECT sum(pg_table_size(c.oid))::bigint, sum(pg_indexes_size(c.oid))::bigint,"
                " (SELECT count(*) FROM "
                + table  # one of TABLES above
                + ") FROM pg_class c WHERE c.oid = %s::regclass"
                " OR c.oid IN (SELECT relid FROM pg_partition_tree(%s) WHERE isleaf)",
                (table, table),
            ).fetchone()
            assert row is not None
            found[table] = {"table_bytes": row[0], "index_bytes": row[1], "rows": row[2]}
    return found


ROW_BYTES = """
SELECT avg(pg_column_size(o.*))::int,
       avg(pg_column_size(o.*) - pg_column_size(o.payload) + pg_column_size('{}'::jsonb))::int
FROM (SELECT * FROM oncebox_outbox LIMIT 10000) o
"""


def row_bytes(url: str) -> dict[str, int]:
    """A sent message's row, as stored (its payload compressed as PostgreSQL keeps it), and the
    same row once retention dropped its payload."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(ROW_BYTES).fetchone()
    assert row is not None
    return {"with_payload": row[0], "without_payload": row[1]}


def measure(url: str, count: int, round_no: int) -> float:
    """Enqueue `count` keyed no-op jobs and drain them with one worker: jobs/s."""
    box = Box(url, retention=QUIET)
    try:

        @box.task(key="bench/{round}/{n}")
        def noop(ctx: oncebox.JobContext, round: int, n: int) -> None:
            pass

        box.enqueue_many(noop, [{"round": round_no, "n": n} for n in range(count)])
        started = time.perf_counter()
        result = box.work(config=WorkerConfig(until_idle=True))
        elapsed = time.perf_counter() - started
        assert result.consumed.completed == count, result.consumed
        return count / elapsed
    finally:
        box.close()


AUTOVACUUM = """
SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.n_dead_tup > COALESCE((SELECT option_value::float8 FROM pg_options_to_table(c.reloptions)
                               WHERE option_name = 'autovacuum_vacuum_threshold'), 50)
                     + COALESCE((SELECT option_value::float8 FROM pg_options_to_table(c.reloptions)
                                 WHERE option_name = 'autovacuum_vacuum_scale_factor'), 0.2)
                       * GREATEST(c.reltuples, 0)
"""


def autovacuum(url: str, stop: Any) -> None:
    """What a production server's autovacuum does, for a server that runs without it (this
    machine's): every `autovacuum_naptime` (1 min), each table past its own thresholds (oncebox
    sets 2 % on the jobs and outbox tables) is vacuumed and analysed, while the workers run."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.wait(60):
            for (table,) in conn.execute(AUTOVACUUM).fetchall():
                conn.execute(f'VACUUM (ANALYZE) "{table}"'.encode())  # a name the server gave


def prune(url: str, duty: float, done: Any) -> None:
    """The pruner lane as a worker runs it (paced), in a process of its own, until nothing full
    is left; puts (rows pruned by kind, seconds) on `done`."""
    box = Box(url)
    try:
        pruner = Pruner(box.store, PrunerConfig(duty=duty), plan_for(box.runtime))
        totals: dict[str, int] = {}
        started = time.perf_counter()
        while True:
            result, pause = pruner.step()
            for kind, acted in result.pruned.items():
                totals[kind] = totals.get(kind, 0) + acted
            if not result.full:
                break
            time.sleep(pause)
        done.put((totals, time.perf_counter() - started))
    finally:
        box.close()


def run(
    server: str, *, rows: int, count: int, rounds: int, duty: float, gap: float
) -> dict[str, Any]:
    with postgres_url(server)() as url:
        loaded_s = load(url, rows)
        before = sizes(url)
        message_row = row_bytes(url)
        stop = threading.Event()
        vacuum = threading.Thread(target=autovacuum, args=(url, stop), daemon=True)
        vacuum.start()
        baseline = [measure(url, count, n) for n in range(rounds)]
        done: Any = multiprocessing.get_context("spawn").Queue()
        pruner = multiprocessing.get_context("spawn").Process(target=prune, args=(url, duty, done))
        pruner.start()
        during: list[float] = []
        n = rounds
        while pruner.is_alive() or not during:
            during.append(measure(url, count, n))
            n += 1
            pruner.join(gap)  # a round every `gap` s: the measured jobs stay few beside the load
        totals, pruned_s = done.get(timeout=60)
        pruner.join()
        stop.set()
        vacuum.join()
        after = sizes(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM")
        vacuumed = sizes(url)
    removed = totals["jobs"] + totals["messages"]
    return {
        "rows": rows,
        "duty": duty,
        "load_s": round(loaded_s, 1),
        "baseline_per_s": statistics.median(baseline),
        "during_per_s": statistics.median(during),
        "ratio": statistics.median(during) / statistics.median(baseline),
        "rounds_baseline": [round(x) for x in baseline],
        "rounds_during": [round(x) for x in during],
        "pruned": totals,
        "pruned_s": round(pruned_s, 1),
        "pruned_per_s": removed / pruned_s if pruned_s else 0.0,
        "sizes": {"before": before, "after_prune": after, "after_vacuum": vacuumed},
        "message_row_bytes": message_row,
    }


def megabytes(entry: dict[str, int]) -> str:
    return (
        f"{entry['table_bytes'] / 2**20:,.0f} + {entry['index_bytes'] / 2**20:,.0f} "
        f"({entry['rows']:,})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--measure", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--gap", type=float, default=10.0, help="seconds between rounds while pruning"
    )
    parser.add_argument(
        "--duty", type=float, default=PrunerConfig().duty, help="the pruner's (PrunerConfig)"
    )
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    figures = run(
        args.postgres,
        rows=args.rows,
        count=args.measure,
        rounds=args.rounds,
        duty=args.duty,
        gap=args.gap,
    )
    print(
        f"oncebox {oncebox.__version__} · Python {platform.python_version()} · "
        f"{args.rows:,} prunable rows · {args.measure:,} jobs a round"
    )
    print(
        f"worker jobs/s: {figures['baseline_per_s']:,.0f} alone, "
        f"{figures['during_per_s']:,.0f} while pruning (ratio {figures['ratio']:.2f}; rounds "
        f"{figures['rounds_baseline']} then {figures['rounds_during']})"
    )
    print(
        f"pruned {figures['pruned']['jobs']:,} jobs and {figures['pruned']['messages']:,} "
        f"messages (with their attempts) in {figures['pruned_s']:,} s: "
        f"{figures['pruned_per_s']:,.0f} rows/s, paced at duty {args.duty}"
    )
    print(
        f"{'MB table + indexes (rows)':<26} {'before':>24} {'after prune':>24} {'after VACUUM':>24}"
    )
    for table in TABLES:
        cells = [megabytes(figures["sizes"][when][table]) for when in figures["sizes"]]
        print(f"{table:<26} {cells[0]:>24} {cells[1]:>24} {cells[2]:>24}")
    row = figures["message_row_bytes"]
    print(
        f"a sent message's row: {row['with_payload']} bytes with its payload, "
        f"{row['without_payload']} once retention dropped it (before indexes and attempts)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "sizes"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
