"""pgqueuer, workload 4: latency from enqueue to handler start at a steady rate.

    .venv-peers/bin/python bench/peers/pgqueuer_latency.py --server URL [--seconds 10]
                                                           [--rate 200] [--warmup 2]
                                                           [--stats fresh|stale]

Runs in the peers' own virtual environment, both processes on uvloop when it is importable, as
pgqueuer's own CLI runs. A fresh database per run (created on the server, dropped after); the
schema installed with pgqueuer's own `install()`. There is no load before the measurement: with
`--stats fresh` (the default) the installed tables are analysed before the worker starts, so the
planner works from statistics, as on a production server (the benchmark server runs without
autovacuum); `stale` leaves them never analysed. One worker process
(spawned) runs a QueueManager (asyncpg) with its defaults — woken by its LISTEN/NOTIFY — and is
left idle until it has handled a probe job. This process is the producer: one `enqueue` call per
job at a steady rate on absolute deadlines, the payload carrying the job's number and the time
just before the call. Latency runs from `time.time()` right after the call returned (committed)
to `time.time()` on the handler's first line; the worker keeps the start times in memory and
writes them to a file when stopped (SIGTERM → `shutdown`). Jobs of the warm-up are not counted.
Prints one JSON line: p50_ms, p90_ms, p99_ms, max_ms, count (as bench/latency.py), the loop and
the statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Coroutine
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

try:
    import uvloop
except ImportError:  # pgqueuer's CLI falls back to the default loop the same way
    uvloop = None

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the shared figures

from latency_figures import DRAIN_TIMEOUT, percentiles, stop

PROBE = -1
IDLE_BEFORE = 1.0
LOOP = "asyncio" if uvloop is None else "uvloop"
T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on the loop pgqueuer's CLI uses (`pgqueuer.adapters.cli.cli.asyncio_run`)."""
    return asyncio.run(main) if uvloop is None else uvloop.run(main)


async def work(url: str, out: str, handled: Synchronized[int]) -> None:
    conn = await asyncpg.connect(url)
    manager = QueueManager(Queries(AsyncpgDriver(conn)))
    started: dict[int, float] = {}

    @manager.entrypoint("latency")
    async def latency(job: Job) -> None:
        now = time.time()
        assert job.payload is not None
        started.setdefault(json.loads(job.payload)["n"], now)
        with handled.get_lock():
            handled.value += 1

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, manager.shutdown.set)
    try:
        await manager.run()
    finally:
        Path(out).write_text(json.dumps(started))
        if not conn.is_closed():
            await conn.close()


def worker_child(url: str, out: str, handled: Synchronized[int]) -> None:
    run_loop(work(url, out, handled))


async def wait_handled(
    handled: Synchronized[int], target: int, timeout: float, worker: BaseProcess
) -> None:
    deadline = time.monotonic() + timeout
    while handled.value < target and time.monotonic() < deadline:
        if not worker.is_alive():
            raise SystemExit(f"the worker process exited (code {worker.exitcode}) mid-run")
        await asyncio.sleep(0.01)


async def produce(
    queries: Queries, total: int, rate: float
) -> tuple[list[float], list[float], float]:
    loop = asyncio.get_running_loop()
    before: list[float] = []
    after: list[float] = []
    origin = loop.time()
    for n in range(total):
        delay = origin + n / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stamp = time.time()
        await queries.enqueue("latency", json.dumps({"n": n, "t": stamp}).encode(), 0)
        after.append(time.time())
        before.append(stamp)
    return before, after, total / (loop.time() - origin)


async def run(
    server: str, seconds: float, rate: float, warmup: float, stats: str
) -> dict[str, Any]:
    warm = round(warmup * rate)
    total = warm + round(seconds * rate)
    name = f"peer_pgq_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"{server.rsplit('/', 1)[0]}/{name}"
        conn = await asyncpg.connect(url)
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        if stats == "fresh":
            await conn.execute("ANALYZE")
        context = multiprocessing.get_context("spawn")
        handled: Synchronized[int] = context.Value("q", 0)
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "started.json"
            worker = context.Process(
                target=worker_child, args=(url, str(out), handled), daemon=True
            )
            worker.start()
            try:
                await queries.enqueue("latency", json.dumps({"n": PROBE, "t": 0}).encode(), 0)
                await wait_handled(handled, 1, 60.0, worker)
                if handled.value < 1:
                    raise SystemExit("pgqueuer: the worker did not handle the probe within 60 s")
                await asyncio.sleep(IDLE_BEFORE)
                before, after, achieved = await produce(queries, total, rate)
                await wait_handled(handled, total + 1, DRAIN_TIMEOUT, worker)
            finally:
                stop(worker)
                await conn.close()
            if not out.exists():
                raise SystemExit(f"pgqueuer: the worker wrote no start times ({worker.exitcode})")
            started = {int(n): t for n, t in json.loads(out.read_text()).items()}
        return {
            **percentiles("pgqueuer", started, before, after, warm),
            "rate": round(achieved, 1),
            "loop": LOOP,
            "stats": stats,
        }
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE the installed tables before the worker starts; stale: no ANALYZE",
    )
    args = parser.parse_args()
    figures = run_loop(run(args.server, args.seconds, args.rate, args.warmup, args.stats))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
