"""pgqueuer, workload 5: process the first M no-op jobs of a backlog of B with one worker.

    .venv-peers/bin/python bench/peers/pgqueuer_backlog.py --server URL --backlog B --measure M
                                                           --batch 100

Runs in the peers' own virtual environment. A fresh database per run (created on the server,
dropped after); the schema installed with pgqueuer's own `install()`; B jobs enqueued with its
batch `enqueue` (lists, 10 000 a call); then one QueueManager (asyncpg, `mode=drain`, the given
dequeue batch) runs until its entrypoint has counted M jobs and sets `manager.shutdown`, the
documented way to stop it; `run()` returns once the jobs in flight are done and their statuses
flushed. The jobs of the last dequeued batch are all run, so slightly more than M may be
processed; the rate is processed / seconds. No ANALYZE: planner statistics stay as the enqueue
leaves them. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

CHUNK = 10_000


async def analyzed(conn: asyncpg.Connection, table: str) -> int:
    """How many times the table has been analysed (by hand or by autovacuum) so far."""
    count = await conn.fetchval(
        "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables WHERE relname = $1",
        table,
    )
    return int(count or 0)


async def run(server: str, backlog: int, measure: int, batch: int) -> dict[str, Any]:
    name = f"peer_pgq_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        base = server.rsplit("/", 1)[0]
        conn = await asyncpg.connect(f"{base}/{name}")
        stats = await asyncpg.connect(f"{base}/{name}")
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        started = time.perf_counter()
        for offset in range(0, backlog, CHUNK):
            count = min(CHUNK, backlog - offset)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        enqueued = time.perf_counter() - started
        analyzed_before = await analyzed(stats, "pgqueuer")

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
        analyzed_after = await analyzed(stats, "pgqueuer")
        await stats.close()
        await conn.close()
        if done < measure:
            raise SystemExit(f"pgqueuer processed {done} of {measure} jobs")
        return {
            "enqueue_s": enqueued,
            "enqueue_per_s": backlog / enqueued,
            "processed": done,
            "process_s": processed,
            "process_per_s": done / processed,
            "first_job_s": first,
            "analyzed_before": analyzed_before,
            "analyzed_after": analyzed_after,
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
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.server, args.backlog, args.measure, args.batch))))


if __name__ == "__main__":
    main()
