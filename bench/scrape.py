"""What one Prometheus scrape (or one `oncebox status`) costs the database, by backlog size.

    .venv/bin/python bench/scrape.py [--sizes 10000 1000000] [--repeat 5] [--postgres URL]
                                     [--no-sqlite] [--json PATH]

For each size N, on a fresh database: a weekly schedule's period fans out to N subjects (all
ready: the backlog a Monday fan-out leaves), plus one job of another task due a day later (the
one a per-task probe must find behind the whole backlog); the tables are analysed as
autovacuum would, then the exporter's collector (`oncebox.cli.prometheus.StoreCollector`)
collects --repeat times. Reported: the median wall time of a scrape, the median time spent
inside store operations (the database's share, round trips included), the three store
operations that cost the most, and what one refresh of the period figures costs — the exporter
recomputes those in the background (`oncebox.cli.prometheus.PeriodFigures`), never on the
scrape. The target of the numbers issue: at most 50 ms of database time per scrape at a
1 000 000-job backlog.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import postgres_url, sqlite_url

from oncebox import Box, ScheduleContext
from oncebox.cli.prometheus import PeriodFigures, StoreCollector
from oncebox.jobs.periods import iso_week

PERIOD = "2026-W49"


def populate(box: Box, jobs: int) -> None:
    @box.task(key="digest/{n}/{period}")
    def digest(ctx: object, n: int, period: str) -> None: ...

    @box.task(key="reminder/{n}")
    def reminder(ctx: object, n: int) -> None: ...

    @box.schedule("weekly-digest", cron="0 9 * * MON", tz="UTC", period=iso_week, task="digest")
    def subjects(ctx: ScheduleContext) -> Iterator[dict[str, Any]]:
        return ({"n": n, "period": ctx.period} for n in range(jobs))

    box.run_schedule("weekly-digest", PERIOD)
    box.enqueue(reminder, n=1, delay=timedelta(days=1))


def analyse(url: str) -> None:
    """What autovacuum's analyse would have done by the time anyone scrapes."""
    if url.startswith("postgresql"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")


def scrape_once(box: Box, collector: StoreCollector) -> tuple[float, dict[str, float]]:
    before = {name: stats.seconds for name, stats in box.metrics.operations().items()}
    started = time.perf_counter()
    families = list(collector.collect())
    wall = time.perf_counter() - started
    assert families, "a scrape yields metrics"
    spent = {
        name: stats.seconds - before.get(name, 0.0)
        for name, stats in box.metrics.operations().items()
    }
    return wall, {name: seconds for name, seconds in spent.items() if seconds > 0}


def measure(
    make: Callable[[], AbstractContextManager[str]], jobs: int, repeat: int
) -> dict[str, Any]:
    with make() as url:
        box = Box(url)
        try:
            populate(box, jobs)
            analyse(url)
            figures = PeriodFigures(box)
            refreshes = [figures.refresh().took for _ in range(max(1, min(repeat, 3)))]
            collector = StoreCollector(box, figures)
            scrape_once(box, collector)  # warm: plans, caches, connections
            walls, stores, per_op = [], [], {}
            for _ in range(repeat):
                wall, spent = scrape_once(box, collector)
                walls.append(wall)
                stores.append(sum(spent.values()))
                for name, seconds in spent.items():
                    per_op.setdefault(name, []).append(seconds)
        finally:
            box.close()
    top = sorted(((statistics.median(v), k) for k, v in per_op.items()), reverse=True)[:3]
    return {
        "jobs": jobs,
        "scrape_ms": round(1000 * statistics.median(walls), 1),
        "store_ms": round(1000 * statistics.median(stores), 1),
        "top": [{"operation": name, "ms": round(1000 * ms, 1)} for ms, name in top],
        "period_refresh_ms": round(1000 * statistics.median(refreshes), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stores: list[tuple[str, Callable[[], AbstractContextManager[str]]]] = [
        ("postgres", postgres_url(args.postgres))
    ]
    if not args.no_sqlite:
        stores.insert(0, ("sqlite", sqlite_url))
    rows = []
    print(
        f"{'store':9} {'jobs':>10} {'scrape ms':>10} {'store ms':>9} {'periods ms':>11}"
        "  costliest operations"
    )
    for store, make in stores:
        for jobs in args.sizes:
            row = {"store": store, **measure(make, jobs, args.repeat)}
            rows.append(row)
            top = ", ".join(f"{t['operation']} {t['ms']}" for t in row["top"])
            print(
                f"{store:9} {jobs:>10,} {row['scrape_ms']:>10} {row['store_ms']:>9} "
                f"{row['period_refresh_ms']:>11}  {top}"
            )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
