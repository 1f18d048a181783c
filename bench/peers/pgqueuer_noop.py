"""pgqueuer, workload 2: process N no-op jobs with one worker at its best documented setting.

    .venv-peers/bin/python bench/peers/pgqueuer_noop.py --server URL --jobs N --batch 100

Runs in the peers' own virtual environment. A fresh database per run (created on the server,
dropped after); the schema installed with pgqueuer's own `install()`; N jobs enqueued with its
batch `enqueue` (lists); then one QueueManager (asyncpg) drains them in `mode=drain` with the
given dequeue batch. Prints one JSON line: enqueue and processing seconds, jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode


async def run(server: str, jobs: int, batch: int) -> dict[str, float]:
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

        manager = QueueManager(queries)
        done = 0

        @manager.entrypoint("noop")
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
            "process_s": processed,
            "process_per_s": jobs / processed,
        }
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.server, args.jobs, args.batch))))


if __name__ == "__main__":
    main()
