"""How long a deployment from before the history takes to move its finished jobs into it.

    .venv/bin/python bench/history_move.py [--rows 1000000] [--weeks 12] [--batch 5000]
                                           [--postgres URL] [--json PATH]

Migration 0025 (PostgreSQL) leaves the finished jobs a database already holds in the jobs table,
and `oncebox migrate --move-history` (or the workers' pruners, paced) moves them into the weekly
history a batch per transaction (`Store.job_history_tend`). On a fresh database, `--rows` done
jobs that finished over the last `--weeks` weeks are loaded into the jobs table as an older
release left them (`INSERT ... SELECT generate_series`, then ANALYZE, as autovacuum would), and
moved the way the command moves them. Reported: the rows moved per second, the seconds per
million rows, and the weeks made.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import analyse, postgres_url

import oncebox
from oncebox.lanes.pruner import HISTORY_AHEAD
from oncebox.store import open_store

LOAD = """
INSERT INTO oncebox_jobs
    (key, task, queue, args, state, outcome, max_attempts, attempt, run_at, created_at,
     leased_by, leased_at, finished_at)
SELECT 'weekly-digest/customer-' || g || '/2026-W33', 'weekly_digest', 'default',
       jsonb_build_object('customer_id', g, 'period', '2026-W33'), 'done', 'completed', 5, 1,
       f - interval '1 minute', f - interval '1 minute', 'host:1:consumer', f - interval '1 s', f
FROM generate_series(1, %(rows)s) g,
     LATERAL (SELECT now() - make_interval(secs => %(span_s)s * g / %(rows)s) AS f) t
"""


def measure(url: str, rows: int, weeks: int, batch: int) -> dict[str, Any]:
    store = open_store(url)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(LOAD, {"rows": rows, "span_s": timedelta(weeks=weeks).total_seconds()})
        analyse(url)
        started = time.perf_counter()
        moved, made, first = 0, 0, None
        while True:
            tended = store.job_history_tend(HISTORY_AHEAD, batch)
            first = first if first is not None else time.perf_counter() - started
            moved += tended.moved
            made += tended.made or 0
            if not tended.moved:
                break
        took = time.perf_counter() - started
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM oncebox_jobs), "
                "(SELECT count(*) FROM oncebox_job_history)"
            ).fetchone()
        assert row == (0, rows), row
    finally:
        store.close()
    return {
        "rows": rows,
        "weeks": weeks,
        "batch": batch,
        "weeks_made": made,
        "seconds": round(took, 2),
        "rows_per_s": round(moved / took),
        "seconds_per_million": round(took * 1_000_000 / moved, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--weeks", type=int, default=12)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with postgres_url(args.postgres)() as url:
        figures = measure(url, args.rows, args.weeks, args.batch)
    result = {
        "oncebox": oncebox.__version__,
        "python": platform.python_version(),
        "move": figures,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
