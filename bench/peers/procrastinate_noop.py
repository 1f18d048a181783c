"""procrastinate, workload 2: process N no-op jobs with one worker at its best documented setting.

    .venv-peers/bin/python bench/peers/procrastinate_noop.py --server URL --jobs N
                                                             [--stats fresh|stale]

Runs in the peers' own virtual environment, on the default asyncio loop, as procrastinate's own
CLI runs (`asyncio.run`). A fresh database per run (created on the server, dropped after);
procrastinate's schema applied with its schema manager; N jobs deferred with `batch_defer_async`;
then, with `--stats fresh` (the default), an ANALYZE of the database — the statistics a
production server would have by then, from autovacuum (the benchmark server runs without it);
`stale` leaves them as the enqueue left them. Then one worker (`run_worker_async(wait=False)`,
the given concurrency) processes the jobs until the queue is empty. Prints one JSON line: enqueue
and processing seconds, jobs/s, the loop and the statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import psycopg
from procrastinate import App, PsycopgConnector


async def run(server: str, jobs: int, concurrency: int, stats: str) -> dict[str, Any]:
    name = f"peer_proc_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        url = f"{server.rsplit('/', 1)[0]}/{name}"
        app = App(connector=PsycopgConnector(conninfo=url))
        done = 0

        @app.task(name="noop")
        async def noop() -> None:
            nonlocal done
            done += 1

        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            started = time.perf_counter()
            for offset in range(0, jobs, 10_000):
                await noop.batch_defer_async(*({} for _ in range(min(10_000, jobs - offset))))
            enqueued = time.perf_counter() - started
            analysed = 0.0
            if stats == "fresh":
                started = time.perf_counter()
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("ANALYZE")
                analysed = time.perf_counter() - started
            started = time.perf_counter()
            await app.run_worker_async(wait=False, concurrency=concurrency)
            processed = time.perf_counter() - started
        if done != jobs:
            raise SystemExit(f"procrastinate processed {done} of {jobs} jobs")
        return {
            "enqueue_s": enqueued,
            "enqueue_per_s": jobs / enqueued,
            "analyze_s": analysed,
            "process_s": processed,
            "process_per_s": jobs / processed,
            "loop": "asyncio",
            "stats": stats,
        }
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE after the enqueue, as autovacuum would; stale: no ANALYZE",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.server, args.jobs, args.concurrency, args.stats))))


if __name__ == "__main__":
    main()
