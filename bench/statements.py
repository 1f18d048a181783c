"""Where the server's time goes, statement by statement: the full guarantee path three ways.

    .venv/bin/python bench/statements.py [--jobs 20000] [--pg-bin /usr/lib/postgresql/15/bin]
                                         [--json PATH]

The full path (claim, intent, outbox row, settlement; lease, send to the null provider, receipt)
run three ways on a private PostgreSQL cluster that counts every statement (pg_stat_statements,
started as bench/idle.py starts it, in a temporary directory, on a free port): the floor's own
three-table schema and statements (bench/floor.py, mode `full`), oncebox's schema and statements
from the floor's minimal script (mode `ours`), and oncebox's worker (bench/outbox.py). For each
statement: its calls, the rows it touched, and its execution time per row, in microseconds —
the server's side of the gap between the floor and oncebox, split by statement, with oncebox's
statements named as in `store/sql/postgres/`. Times are the server's wall clock inside each
statement (a backend waiting for a core counts), so compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import floor
from idle import PG_BIN, ClusterUnavailable, private_cluster
from outbox import full_path

from oncebox.store import open_store

# comments, constants and placeholders (psycopg's; the server's for constants) compare as one token
_NORMAL = [
    (re.compile(r"--[^\n]*"), ""),
    (re.compile(r"'[^']*'|%\(\w+\)s|%s|\$\d+|\b\d+(\.\d+)?\b|\b(NULL|TRUE|FALSE)\b", re.I), "?"),
    (re.compile(r"\s+"), " "),
]
# what is not a row's work: the runs' own set-up and checks
_SETUP = re.compile(
    r"^\s*(CREATE|DROP|ANALYZE|TRUNCATE|COPY|SET|SELECT count|SELECT pg_stat"
    r"|INSERT INTO oncebox_jobs)"  # floor.oncebox_database's load
)
# the worker's own load, before its clock starts (the floor's is COPY)
_LOAD = {"job_insert_many"}


def normal(sql: str) -> str:
    for pattern, replacement in _NORMAL:
        sql = pattern.sub(replacement, sql)
    return sql.strip().rstrip(";").strip()


NAMES = {normal(text): name for name, text in floor.OURS.items()}


def label(query: str) -> str:
    return NAMES.get(normal(query)) or normal(query)[:60]


def measure(admin: str, run: Callable[[str], object], database: str) -> list[dict[str, Any]]:
    """Run `run(url)` on a fresh database of the cluster, counting its statements."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"'.encode())
        url = admin.rsplit("/", 1)[0] + f"/{database}"
        conn.execute("SELECT pg_stat_statements_reset()")
        run(url)
        rows = conn.execute(
            "SELECT s.query, s.calls, s.rows, s.total_exec_time FROM pg_stat_statements s "
            # a database the run made and dropped (floor.oncebox_database's) has no row any more
            "LEFT JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname IS DISTINCT FROM 'postgres' AND s.toplevel AND s.rows > 0 "
            "ORDER BY s.total_exec_time DESC"
        ).fetchall()
    found: dict[str, dict[str, Any]] = {}
    for query, calls, touched, ms in rows:
        if _SETUP.match(normal(query)):
            continue
        entry = found.setdefault(label(query), {"calls": 0, "rows": 0, "ms": 0.0})
        entry["calls"] += calls
        entry["rows"] += touched
        entry["ms"] += ms
    return [
        {"statement": name, **e, "us_per_row": round(1000 * e["ms"] / e["rows"], 1)}
        for name, e in found.items()
    ]


def runs(jobs: int) -> dict[str, Callable[[str], object]]:
    def the_floor(url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(floor.SCHEMA.encode())
        floor.copy_jobs(url, jobs)
        floor.lanes_concurrently(
            lambda start, written: floor.consume(url, floor.FULL, start, written),
            lambda done, written: floor.dispatch(url, jobs, done, written),
            jobs,
            "the full path",
        )
        floor.check_full(url, jobs)

    def ours(url: str) -> None:
        # floor.oncebox_database makes a database of its own on the given server; use it as is
        with floor.oncebox_database(url, jobs) as own:
            floor.lanes_concurrently(
                lambda start, written: floor.consume_ours(own, start, written),
                lambda done, written: floor.dispatch_ours(own, jobs, done, written),
                jobs,
                "oncebox's SQL",
            )
            floor.check_ours(own, jobs)

    def worker(url: str) -> None:
        open_store(url, migrate=True).close()
        full_path(url, jobs)

    return {"the floor's SQL": the_floor, "oncebox's SQL": ours, "oncebox's worker": worker}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--pg-bin", type=Path, default=PG_BIN)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        result = measure_all(args.jobs, args.pg_bin)
    except ClusterUnavailable as exc:
        print(f"statements: no private cluster to count statements on: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def measure_all(jobs: int, pg_bin: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"jobs": jobs}
    with private_cluster(pg_bin) as admin:
        for n, (what, run) in enumerate(runs(jobs).items()):
            statements = measure(admin, run, f"statements_{n}")
            total = sum(s["ms"] for s in statements if s["statement"] not in _LOAD)
            result[what] = {"statements": statements, "us_per_job": 1000 * total / jobs}
            print(
                f"\n{what}: {1000 * total / jobs:.1f} µs of statement time per job (the load apart)"
            )
            print(f"  {'statement':<42}{'calls':>7}{'rows':>9}{'µs/row':>9}")
            for s in statements:
                print(
                    f"  {s['statement'][:42]:<42}{s['calls']:>7}{s['rows']:>9}{s['us_per_row']:>9}"
                )
    return result


if __name__ == "__main__":
    sys.exit(main())
