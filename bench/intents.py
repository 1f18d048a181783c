"""The claim's cost as intents pile up: no-op keyed throughput with a year of intents kept.

    .venv/bin/python bench/intents.py [--intents 0 10000000] [--measure 20000] [--repeat 1]
                                      [--postgres URL] [--json PATH]

Intents are tombstones kept for as long as a duplicate can arrive (`keep_intents=`, e.g. 400
days for weekly digests): 1 000 000 subjects a week keep 52 000 000 of them. The claim inserts
one per job (`INSERT ... ON CONFLICT (key) DO NOTHING`), so what matters is that its cost stays
flat as the table grows. For each size I, on a fresh PostgreSQL database: I intents are written
straight into `oncebox_intents` by one `INSERT ... SELECT generate_series` (keys shaped like a
weekly digest's, spread over a year of claims; its primary key and index rebuilt after the load,
as a table grown over a year would be, then analysed), then M new keyed no-op jobs are enqueued
and one worker drains them (`box.work(until_idle=True)`, default settings). Reported per size:
jobs/s, and the intents table's and its indexes' size on disk. The ratio of the largest size's
figure to the smallest's is the flatness; target >= 0.8.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import analyse, postgres_url

import oncebox
from oncebox import Box, WorkerConfig

# a year of weekly digests' keys, as `weekly-digest/customer-{id}/{period}` renders them
LOAD = """
INSERT INTO oncebox_intents (key, task, job_id, claimed_at)
SELECT format('weekly-digest/customer-%%s/2025-W%%s', n / 52, lpad((n %% 52 + 1)::text, 2, '0')),
       'weekly_digest', NULL,
       now() - make_interval(days => 365) + make_interval(secs => n * 31536000.0 / %(count)s)
FROM generate_series(0, %(count)s - 1) AS n
"""


def load_intents(url: str, count: int) -> float:
    """Write `count` intents; returns the seconds it took. The key's uniqueness is dropped for
    the load and rebuilt after (a sorted build), which is what a year of inserts leaves too."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE oncebox_intents DROP CONSTRAINT oncebox_intents_pkey")
        conn.execute("DROP INDEX oncebox_intents_task_claimed")
        conn.execute("SET maintenance_work_mem = '512MB'")
        if count:
            conn.execute(LOAD.encode(), {"count": count})
        conn.execute("ALTER TABLE oncebox_intents ADD PRIMARY KEY (key)")
        conn.execute(
            "CREATE INDEX oncebox_intents_task_claimed ON oncebox_intents (task, claimed_at)"
        )
    analyse(url)
    return time.perf_counter() - started


def sizes(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_relation_size('oncebox_intents'), pg_indexes_size('oncebox_intents'), "
            "(SELECT count(*) FROM oncebox_intents)"
        ).fetchone()
    assert row is not None
    return {"table_bytes": int(row[0]), "index_bytes": int(row[1]), "rows": int(row[2])}


def run_once(server: str, intents: int, measure: int) -> dict[str, Any]:
    with postgres_url(server)() as url:
        loaded_s = load_intents(url, intents)
        box = Box(url)
        try:

            @box.task(key="weekly-digest/customer-{n}/{period}")
            def weekly_digest(ctx: oncebox.JobContext, n: int, period: str) -> None:
                pass

            box.enqueue_many(
                weekly_digest, [{"n": n, "period": "2026-W49"} for n in range(measure)]
            )
            analyse(url)
            started = time.perf_counter()
            result = box.work(config=WorkerConfig(until_idle=True))
            elapsed = time.perf_counter() - started
            assert result.consumed.completed == measure, result.consumed
        finally:
            box.close()
        return {
            "intents": intents,
            "measure": measure,
            "load_s": round(loaded_s, 1),
            "process_per_s": measure / elapsed,
            **sizes(url),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intents", type=int, nargs="+", default=[0, 10_000_000])
    parser.add_argument("--measure", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for intents in args.intents:
        runs = [run_once(args.postgres, intents, args.measure) for _ in range(args.repeat)]
        row = {**runs[-1], "process_per_s": statistics.median(r["process_per_s"] for r in runs)}
        rows.append(row)
    print(
        f"oncebox {oncebox.__version__} · Python {platform.python_version()} · "
        f"{args.measure} jobs measured · median of {args.repeat}"
    )
    print(f"{'intents':>12} {'jobs/s':>9} {'table MB':>9} {'indexes MB':>11} {'load s':>7}")
    for row in rows:
        print(
            f"{row['intents']:>12,} {row['process_per_s']:>9,.0f} "
            f"{row['table_bytes'] / 2**20:>9,.0f} {row['index_bytes'] / 2**20:>11,.0f} "
            f"{row['load_s']:>7}"
        )
    flat = rows[-1]["process_per_s"] / rows[0]["process_per_s"]
    print(f"largest / smallest: {flat:.2f} (target >= 0.8)")
    figures = {"measure": args.measure, "repeat": args.repeat, "rows": rows, "flat": flat}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
