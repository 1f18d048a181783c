"""pgqueuer, workload 2: process N no-op jobs with one worker at its best documented setting.

    .venv-peers/bin/python bench/peers/pgqueuer_noop.py --server URL --jobs N --batch 100
                                                        [--stats fresh|stale]

Runs in the peers' own virtual environment, on uvloop when it is importable, as pgqueuer's own
CLI runs. A fresh database per run (created on the server, dropped after); the schema installed
with pgqueuer's own `install()`; N jobs enqueued with its batch `enqueue` (lists); then, with
`--stats fresh` (the default), an ANALYZE of the database — the statistics a production server
would have by then, from autovacuum (the benchmark server runs without it); `stale` leaves them
as the enqueue left them. Then one QueueManager (asyncpg) drains the jobs in `mode=drain` with
the given dequeue batch. Prints one JSON line: enqueue and processing seconds, jobs/s, the loop
and the statistics. `--concurrency-limit N` declares the entrypoint with pgqueuer's own
database-enforced `concurrency_limit` (bench/limits.py: what a limit costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

try:
    import uvloop
except ImportError:  # pgqueuer's CLI falls back to the default loop the same way
    uvloop = None

LOOP = "asyncio" if uvloop is None else "uvloop"
T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on the loop pgqueuer's CLI uses (`pgqueuer.adapters.cli.cli.asyncio_run`)."""
    return asyncio.run(main) if uvloop is None else uvloop.run(main)


async def run(
    server: str, jobs: int, batch: int, stats: str, concurrency_limit: int = 0
) -> dict[str, Any]:
    name = f"peer_pgq_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = server.rsplit("/", 1)[0]
        conn = await asyncpg.connect(f"{base}/{name}")
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        started = time.perf_counter()
        for offset in range(0, jobs, 10_000):
            count = min(10_000, jobs - offset)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        enqueued = time.perf_counter() - started
        analysed = 0.0
        if stats == "fresh":
            started = time.perf_counter()
            await conn.execute("ANALYZE")
            analysed = time.perf_counter() - started

        manager = QueueManager(queries)
        done = 0

        @manager.entrypoint("noop", concurrency_limit=concurrency_limit)
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

        started = time.perf_counter()
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
        processed = time.perf_counter() - started
        await conn.close()
        if done != jobs:
            raise SystemExit(f"pgqueuer processed {done} of {jobs} jobs")
        return {
            "enqueue_s": enqueued,
            "enqueue_per_s": jobs / enqueued,
            "analyze_s": analysed,
            "process_s": processed,
            "process_per_s": jobs / processed,
            "loop": LOOP,
            "stats": stats,
        }
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE after the enqueue, as autovacuum would; stale: no ANALYZE",
    )
    parser.add_argument(
        "--concurrency-limit",
        type=int,
        default=0,
        help="the entrypoint's concurrency_limit (0: none), enforced in the database",
    )
    args = parser.parse_args()
    figures = run(args.server, args.jobs, args.batch, args.stats, args.concurrency_limit)
    print(json.dumps(run_loop(figures)))


if __name__ == "__main__":
    main()
