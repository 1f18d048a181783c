"""Fan-out benchmark: one period's fan-out over N eligible customers, time and peak memory.

    .venv/bin/python bench/fanout.py [--postgres-customers 1000000] [--sqlite-customers 100000]

Each store runs in a fresh child process (so its peak memory is its own) on a fresh database: N
customers are inserted, then the weekly-digest schedule fans out 2026-W33 — the eligible set
streamed from the database (a server-side cursor on PostgreSQL), jobs enqueued in batches of
5 000 by key. Reported: seconds, jobs/s, and the child's peak RSS before and after the fan-out
(memory must stay flat in N: compare a small N with a large one).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import postgres_url, sqlite_url


def run(kind: str, customers: int, server: str, results: Any) -> None:
    from oncebox import Box, JobContext, ScheduleContext
    from oncebox.jobs.periods import iso_week

    make = sqlite_url if kind == "sqlite" else postgres_url(server)
    with make() as url:
        box = Box(url)

        @box.task(key="weekly-digest/customer-{customer_id}/{period}")
        def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
            pass

        @box.schedule("weekly-digest", cron="0 9 * * MON", period=iso_week, task=weekly_digest)
        def active(ctx: ScheduleContext) -> Any:
            if ctx.dialect == "postgres":
                with ctx.connection.cursor(name="eligible") as cursor:
                    cursor.itersize = 5000
                    cursor.execute("SELECT id FROM customers ORDER BY id")
                    for (customer_id,) in cursor:
                        yield {"customer_id": customer_id, "period": ctx.period}
            else:
                for (customer_id,) in ctx.connection.execute(
                    "SELECT id FROM customers ORDER BY id"
                ):
                    yield {"customer_id": customer_id, "period": ctx.period}

        conn = box.store.connect()  # type: ignore[attr-defined]
        conn.execute("CREATE TABLE customers (id BIGINT PRIMARY KEY)")
        if kind == "postgres":
            conn.execute("INSERT INTO customers SELECT generate_series(1, %s)", (customers,))
        else:
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                "WHERE i < ?) INSERT INTO customers SELECT i FROM n",
                (customers,),
            )
        conn.commit()
        conn.close()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        result = box.run_schedule("weekly-digest", "2026-W33")
        elapsed = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert result.enqueued == customers, result
        box.close()
    results.put(
        {
            "store": kind,
            "customers": customers,
            "seconds": round(elapsed, 2),
            "per_s": round(customers / elapsed),
            "rss_before_mb": round(before / 1024),
            "rss_after_mb": round(after / 1024),
        }
    )


def measure(kind: str, customers: int, server: str) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=run, args=(kind, customers, server, results))
    child.start()
    row = results.get(timeout=3600)
    child.join()
    return dict(row)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--postgres-customers", type=int, default=1_000_000)
    parser.add_argument("--sqlite-customers", type=int, default=100_000)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [measure("sqlite", args.sqlite_customers, args.postgres)]
    if not args.no_postgres:
        rows.append(measure("postgres", args.postgres_customers, args.postgres))
    print(
        f"{'store':<10}{'customers':>11}{'seconds':>9}{'jobs/s':>10}{'RSS before':>12}{'after':>8}"
    )
    for r in rows:
        print(
            f"{r['store']:<10}{r['customers']:>11,}{r['seconds']:>9}{r['per_s']:>10,}"
            f"{r['rss_before_mb']:>10} MB{r['rss_after_mb']:>5} MB"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
