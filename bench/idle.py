"""Workload 7: how many queries an idle worker makes, across all its lanes (PostgreSQL).

    .venv/bin/python bench/idle.py [--seconds 30] [--postgres URL] [--json PATH]

A worker process (consumer, dispatcher, scheduler, sweeper, rescuer, pruner lanes; one task,
one schedule, one sweeper, one channel) runs on a fresh database with nothing to do. After a
warm-up, the server's own counters for that database (`pg_stat_database.xact_commit +
xact_rollback`: every autocommit query is a transaction) are read before and after the window;
the figure is transactions per second. The target is at most 1 per second (LISTEN/NOTIFY wakes
the lanes; polls are the fallback).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import postgres_url


def idle_worker(url: str) -> None:
    from oncebox import Box, JobContext
    from oncebox.periods import iso_week
    from oncebox.schedule import ScheduleContext
    from oncebox.sweeper import SweepContext

    box = Box(url)  # the worker stores a secret of its own
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

    box.work()


def transactions(conn: psycopg.Connection[Any], database: str) -> int:
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
        (database,),
    ).fetchone()
    return int(row[0]) if row else 0


def measure(server: str, seconds: float, warmup: float) -> dict[str, float]:
    with postgres_url(server)() as url:
        database = url.rsplit("/", 1)[1]
        context = multiprocessing.get_context("spawn")
        worker = context.Process(target=idle_worker, args=(url,), daemon=True)
        worker.start()
        try:
            time.sleep(warmup)  # a benchmark's window, not a test's synchronisation
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_clear_snapshot()")
                before = transactions(conn, database)
                time.sleep(seconds)
                conn.execute("SELECT pg_stat_clear_snapshot()")
                after = transactions(conn, database)
        finally:
            if worker.pid is not None:
                os.kill(worker.pid, signal.SIGTERM)
            worker.join(30)
    return {"seconds": seconds, "transactions": after - before, "per_s": (after - before) / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    figures = measure(args.postgres, args.seconds, args.warmup)
    print(
        f"idle worker on PostgreSQL: {figures['transactions']} transactions in "
        f"{args.seconds:g} s = {figures['per_s']:.2f}/s (target ≤ 1/s)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
