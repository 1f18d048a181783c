"""Core benchmark: bulk enqueue and no-op processing on SQLite and PostgreSQL.

    .venv/bin/python bench/core.py [--jobs 20000] [--repeat 3] [--postgres URL] [--json PATH]

Each figure is the median of `--repeat` runs, each on a fresh database (a temporary SQLite file; a
new PostgreSQL database created on the server and dropped after). "keyed" jobs go through the
whole guarantee path — the claim inserts an intent per key in the consumer transaction; "keyless"
jobs skip the intent (plain at-least-once). One worker process, one consumer thread, default
batch settings. Figures print as a table and, with --json, are written for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import psycopg

import oncebox
from oncebox import Box, WorkerConfig


@contextmanager
def sqlite_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        yield f"sqlite:///{Path(folder) / 'bench.db'}"


def postgres_url(server: str) -> Callable[[], AbstractContextManager[str]]:
    @contextmanager
    def make() -> Iterator[str]:
        name = f"oncebox_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"'.encode())
        base = psycopg.conninfo.conninfo_to_dict(server)
        url = f"postgresql://{base.get('host', '127.0.0.1')}:{base.get('port', 5432)}/{name}"
        try:
            oncebox.store.open_store(url, migrate=True).close()
            yield url
        finally:
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())

    return make


def analyse(url: str) -> None:
    """The statistics a production server has by the time a worker drains a load: autovacuum's
    analyse (the benchmark server runs with autovacuum off, so it is run by hand)."""
    if url.startswith("postgresql"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")


def noop_box(url: str, keyed: bool) -> Box:
    """A Box with the no-op task `noop`: keyed ("bench/{n}", through the claim) or keyless."""
    box = Box(url)
    if keyed:

        @box.task(key="bench/{n}")
        def noop(ctx: oncebox.JobContext, n: int) -> None:
            pass

    else:

        @box.task(name="noop")
        def noop_keyless(ctx: oncebox.JobContext, n: int) -> None:
            pass

    return box


def run_once(url: str, jobs: int, keyed: bool, stats: str = "fresh") -> dict[str, float]:
    """Bulk-enqueue `jobs` no-op jobs, then drain them with one worker. `stats`: "fresh"
    analyses the tables after the load, as autovacuum would; "stale" leaves the statistics of
    the empty tables (a robustness row: oncebox's lease forces its index order)."""
    box = noop_box(url, keyed)
    try:
        started = time.perf_counter()
        created = box.enqueue_many("noop", [{"n": i} for i in range(jobs)]).created
        enqueued = time.perf_counter() - started
        assert created == jobs
        if stats == "fresh":
            analyse(url)
        started = time.perf_counter()
        result = box.work(config=WorkerConfig(until_idle=True))
        processed = time.perf_counter() - started
        assert result.consumed.completed == jobs, result.consumed
        return {"enqueue": jobs / enqueued, "process": jobs / processed}
    finally:
        box.close()


def measure(
    make_url: Callable[[], AbstractContextManager[str]], jobs: int, repeat: int, keyed: bool
) -> dict[str, float]:
    runs = []
    for _ in range(repeat):
        with make_url() as url:
            runs.append(run_once(url, jobs, keyed))
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stores: dict[str, Callable[[], AbstractContextManager[str]]] = {"sqlite": sqlite_url}
    if not args.no_postgres:
        stores["postgres"] = postgres_url(args.postgres)
    rows = []
    for store, make in stores.items():
        for keyed in (True, False):
            figures = measure(make, args.jobs, args.repeat, keyed)
            rows.append(
                {
                    "store": store,
                    "jobs": "keyed" if keyed else "keyless",
                    "n": args.jobs,
                    **{k: round(v) for k, v in figures.items()},
                }
            )
    print(
        f"oncebox {oncebox.__version__} · Python {platform.python_version()} · "
        f"{platform.machine()} · {args.jobs} jobs · median of {args.repeat}"
    )
    print(f"{'store':<10}{'jobs':<9}{'bulk enqueue/s':>16}{'no-op process/s':>17}")
    for row in rows:
        print(f"{row['store']:<10}{row['jobs']:<9}{row['enqueue']:>16,}{row['process']:>17,}")
    if args.json:
        args.json.write_text(
            json.dumps({"jobs": args.jobs, "repeat": args.repeat, "rows": rows}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
