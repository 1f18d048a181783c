"""Workload 7: how many queries an idle worker makes, across all its lanes (PostgreSQL).

    .venv/bin/python bench/idle.py [--seconds 30] [--postgres URL] [--json PATH]

A worker process (consumer, dispatcher, scheduler, sweeper, rescuer, pruner lanes; one task,
one schedule, one sweeper, one channel) runs on a fresh database with nothing to do. After a
warm-up, two counts over the window:
- the worker's own: every transaction it starts — an autocommit statement, or a transaction
  block however many statements it holds (pipelined or not) — recorded by wrapping psycopg in the
  worker process, with the statement that began it; this is the figure against the target;
- the server's: `pg_stat_database.xact_commit + xact_rollback` for the database, a cross-check
  only: backends report their counters lazily (an idle one at most every 10 s), so a 30 s
  window can catch a report from before it or miss one from its end.
The target is at most 1 per second (LISTEN/NOTIFY wakes the lanes; polls are the fallback).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing
import os
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import postgres_url, sqlite_url


def count_transactions(log: list[tuple[float, str]]) -> None:
    """Record (time, first statement) for every transaction this process starts."""
    depth = threading.local()
    execute, transaction = psycopg.Cursor.execute, psycopg.Connection.transaction

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(depth, "n", 0):
            text = query.decode() if isinstance(query, bytes) else str(query)
            lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
            log.append((time.time(), " ".join(" ".join(lines).split())[:70]))
        return execute(self, query, *args, **kwargs)

    @contextlib.contextmanager
    def counted_transaction(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if not getattr(depth, "n", 0):
            log.append((time.time(), "BEGIN … COMMIT"))
        depth.n = getattr(depth, "n", 0) + 1
        try:
            with transaction(self, *args, **kwargs) as tx:
                yield tx
        finally:
            depth.n -= 1

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Connection.transaction = counted_transaction  # type: ignore[method-assign]


def count_sqlite_transactions(log: list[tuple[float, str]]) -> None:
    """The same for SQLite: the store's connections run in autocommit mode (its writes begin
    with an explicit BEGIN IMMEDIATE), so a statement run outside a transaction starts one."""
    connect = sqlite3.connect

    class Counted(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if not self.in_transaction:
                lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
                log.append((time.time(), " ".join(" ".join(lines).split())[:70]))
            return super().execute(sql, *args)

    def counted_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, **{**kwargs, "factory": Counted})

    sqlite3.connect = counted_connect  # type: ignore[assignment]


def idle_worker(url: str, log_path: str) -> None:
    from oncebox import Box, JobContext, ScheduleContext, SweepContext
    from oncebox.jobs.periods import iso_week

    box = Box(url)  # the worker stores a secret of its own (a new connection: counted or not)
    box.channel("email", provider="null:")

    @box.task(key="idle/{n}")
    def task(ctx: JobContext, n: int) -> None:
        pass

    @box.schedule("weekly", cron="0 9 * * MON", period=iso_week, task=task)
    def nobody(ctx: ScheduleContext) -> Any:
        return []

    @box.sweeper("nothing-due", every=timedelta(seconds=30))
    def sweep(ctx: SweepContext) -> int:
        return 0

    log: list[tuple[float, str]] = []
    count_transactions(log)
    count_sqlite_transactions(log)
    box.work()  # until SIGTERM (a graceful stop)
    Path(log_path).write_text(json.dumps(log))


def transactions(conn: psycopg.Connection[Any], database: str) -> int:
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
        (database,),
    ).fetchone()
    return int(row[0]) if row else 0


def measure(server: str, seconds: float, warmup: float) -> dict[str, Any]:
    """Workload 7 on a fresh PostgreSQL database of `server`."""
    with postgres_url(server)() as url:
        database = url.rsplit("/", 1)[1]
        with psycopg.connect(server, autocommit=True) as conn:

            def counter() -> int:
                conn.execute("SELECT pg_stat_clear_snapshot()")
                return transactions(conn, database)

            return watch_idle(url, seconds, warmup, counter)


def measure_sqlite(seconds: float, warmup: float) -> dict[str, Any]:
    """Workload 7 on a temporary SQLite file (the listener watches its files; no queries)."""
    with sqlite_url() as url:
        return watch_idle(url, seconds, warmup, None)


def watch_idle(
    url: str, seconds: float, warmup: float, server_count: Callable[[], int] | None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        log_path = str(Path(folder) / "transactions.json")
        context = multiprocessing.get_context("spawn")
        worker = context.Process(target=idle_worker, args=(url, log_path), daemon=True)
        worker.start()
        try:
            time.sleep(warmup)  # a benchmark's window, not a test's synchronisation
            before, start = server_count() if server_count else 0, time.time()
            time.sleep(seconds)
            after, end = server_count() if server_count else 0, time.time()
        finally:
            if worker.pid is not None:
                os.kill(worker.pid, signal.SIGTERM)
            worker.join(30)
        if not Path(log_path).exists():
            raise SystemExit("the idle worker did not write its transaction log (did it crash?)")
        window = [what for at, what in json.loads(Path(log_path).read_text()) if start <= at < end]
    return {
        "seconds": seconds,
        "worker_transactions": len(window),
        "per_s": len(window) / seconds,
        "by_statement": dict(collections.Counter(window).most_common()),
        "server_transactions": (after - before) if server_count else None,
        "server_per_s": (after - before) / seconds if server_count else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    figures = measure(args.postgres, args.seconds, args.warmup)
    print(
        f"idle worker on PostgreSQL: {figures['worker_transactions']} transactions in "
        f"{args.seconds:g} s = {figures['per_s']:.2f}/s (target ≤ 1/s); the server counted "
        f"{figures['server_per_s']:.2f}/s in that database (a lagging cross-check)"
    )
    for what, count in figures["by_statement"].items():
        print(f"{count:6d}  {what}")
    local = measure_sqlite(args.seconds, args.warmup)
    print(
        f"idle worker on SQLite: {local['worker_transactions']} transactions in "
        f"{args.seconds:g} s = {local['per_s']:.2f}/s (target ≤ 2/s)"
    )
    for what, count in local["by_statement"].items():
        print(f"{count:6d}  {what}")
    figures = {**figures, "sqlite": local}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
