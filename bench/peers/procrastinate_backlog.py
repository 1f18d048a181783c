"""procrastinate, workload 5: process the first M no-op jobs of a backlog of B with one worker.

    .venv-peers/bin/python bench/peers/procrastinate_backlog.py --server URL --backlog B
                                                                --measure M --concurrency 10
                                                                [--stats fresh|stale]

Runs in the peers' own virtual environment, on the default asyncio loop, as procrastinate's own
CLI runs (`asyncio.run`). A fresh database per run (created on the server, dropped after);
procrastinate's schema applied with its schema manager; B jobs deferred with `batch_defer_async`
(10 000 a call); then, with `--stats fresh` (the default), an ANALYZE of the database — the
statistics a production server would have by then, from autovacuum (the benchmark server runs
without it); `stale` leaves them as the enqueue left them (workers that start the moment a
fan-out lands). Then one worker (`run_worker_async(wait=False)`, the given concurrency) runs as a
task until the jobs have counted M, and is stopped by cancelling that task — procrastinate's
documented graceful stop: the jobs in flight finish first, so slightly more than M may be
processed; the rate is processed / seconds. How many times the jobs table had been analysed (by
hand, ours included, or by autovacuum) when the measurement started and when it ended is
reported. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

import psycopg
from procrastinate import App, PsycopgConnector

CHUNK = 10_000


def analyzed(url: str, table: str) -> int:
    """How many times the table has been analysed (by hand or by autovacuum) so far."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables WHERE relname = %s",
            (table,),
        ).fetchone()
    return int(row[0]) if row else 0


async def run(
    server: str, backlog: int, measure: int, concurrency: int, stats: str
) -> dict[str, Any]:
    name = f"peer_proc_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        url = f"{server.rsplit('/', 1)[0]}/{name}"
        app = App(connector=PsycopgConnector(conninfo=url))
        done = 0
        first = 0.0
        reached = asyncio.Event()

        @app.task(name="noop")
        async def noop() -> None:
            nonlocal done, first
            done += 1
            first = first or time.perf_counter() - started
            if done == measure:
                reached.set()

        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            started = time.perf_counter()
            for offset in range(0, backlog, CHUNK):
                await noop.batch_defer_async(*({} for _ in range(min(CHUNK, backlog - offset))))
            enqueued = time.perf_counter() - started
            analysed = 0.0
            if stats == "fresh":
                started = time.perf_counter()
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("ANALYZE")
                analysed = time.perf_counter() - started
            analyzed_before = analyzed(url, "procrastinate_jobs")
            started = time.perf_counter()
            worker = asyncio.create_task(
                app.run_worker_async(
                    wait=False, concurrency=concurrency, install_signal_handlers=False
                )
            )
            waiter = asyncio.create_task(reached.wait())
            await asyncio.wait((worker, waiter), return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            processed = time.perf_counter() - started
        if done < measure:
            raise SystemExit(f"procrastinate processed {done} of {measure} jobs")
        return {
            "enqueue_s": enqueued,
            "enqueue_per_s": backlog / enqueued,
            "analyze_s": analysed,
            "processed": done,
            "process_s": processed,
            "process_per_s": done / processed,
            "first_job_s": first,
            "analyzed_before": analyzed_before,
            "analyzed_after": analyzed(url, "procrastinate_jobs"),
            "loop": "asyncio",
            "stats": stats,
        }
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--measure", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE after the enqueue, as autovacuum would; stale: no ANALYZE",
    )
    args = parser.parse_args()
    figures = asyncio.run(
        run(args.server, args.backlog, args.measure, args.concurrency, args.stats)
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
