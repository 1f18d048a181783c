"""pgqueuer, workload 5: process the first M no-op jobs of a backlog of B with one worker.

    .venv-peers/bin/python bench/peers/pgqueuer_backlog.py --server URL --backlog B --measure M
                                                           --batch 100 [--stats fresh|stale]

Runs in the peers' own virtual environment, on uvloop when it is importable, as pgqueuer's own
CLI runs. A fresh database per run (created on the server, dropped after); the schema installed
with pgqueuer's own `install()`; B jobs enqueued with its batch `enqueue` (lists, 10 000 a call);
then, with `--stats fresh` (the default), an ANALYZE of the database — the statistics a
production server would have by then, from autovacuum (the benchmark server runs without it);
`stale` leaves them as the enqueue left them (workers that start the moment a fan-out lands).
Then one QueueManager (asyncpg, `mode=drain`, the given dequeue batch) runs until its entrypoint
has counted M jobs and sets `manager.shutdown`, the documented way to stop it; `run()` returns
once the jobs in flight are done and their statuses flushed. The jobs of the last dequeued batch
are all run, so slightly more than M may be processed; the rate is processed / seconds. How many
times the jobs table had been analysed (by hand, ours included, or by autovacuum) when the
measurement started and when it ended is reported. Prints one JSON line.
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

CHUNK = 10_000
LOOP = "asyncio" if uvloop is None else "uvloop"
T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on the loop pgqueuer's CLI uses (`pgqueuer.adapters.cli.cli.asyncio_run`)."""
    return asyncio.run(main) if uvloop is None else uvloop.run(main)


async def analyzed(conn: asyncpg.Connection, table: str) -> int:
    """How many times the table has been analysed (by hand or by autovacuum) so far."""
    count = await conn.fetchval(
        "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables WHERE relname = $1",
        table,
    )
    return int(count or 0)


async def run(server: str, backlog: int, measure: int, batch: int, stats: str) -> dict[str, Any]:
    name = f"peer_pgq_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = server.rsplit("/", 1)[0]
        conn = await asyncpg.connect(f"{base}/{name}")
        observer = await asyncpg.connect(f"{base}/{name}")
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        started = time.perf_counter()
        for offset in range(0, backlog, CHUNK):
            count = min(CHUNK, backlog - offset)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        enqueued = time.perf_counter() - started
        analysed = 0.0
        if stats == "fresh":
            started = time.perf_counter()
            await conn.execute("ANALYZE")
            analysed = time.perf_counter() - started
        analyzed_before = await analyzed(observer, "pgqueuer")

        manager = QueueManager(queries)
        done = 0
        first = 0.0

        @manager.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal done, first
            done += 1
            first = first or time.perf_counter() - started
            if done == measure:
                manager.shutdown.set()

        started = time.perf_counter()
        await manager.run(batch_size=batch, mode=QueueExecutionMode.drain)
        processed = time.perf_counter() - started
        analyzed_after = await analyzed(observer, "pgqueuer")
        await observer.close()
        await conn.close()
        if done < measure:
            raise SystemExit(f"pgqueuer processed {done} of {measure} jobs")
        return {
            "enqueue_s": enqueued,
            "enqueue_per_s": backlog / enqueued,
            "analyze_s": analysed,
            "processed": done,
            "process_s": processed,
            "process_per_s": done / processed,
            "first_job_s": first,
            "analyzed_before": analyzed_before,
            "analyzed_after": analyzed_after,
            "loop": LOOP,
            "stats": stats,
        }
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--measure", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE after the enqueue, as autovacuum would; stale: no ANALYZE",
    )
    args = parser.parse_args()
    figures = run_loop(run(args.server, args.backlog, args.measure, args.batch, args.stats))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
