"""procrastinate, workload 4: latency from enqueue to handler start at a steady rate.

    .venv-peers/bin/python bench/peers/procrastinate_latency.py --server URL [--seconds 10]
                                                                [--rate 200] [--warmup 2]
                                                                [--concurrency 1]
                                                                [--stats fresh|stale]

Runs in the peers' own virtual environment, on the default asyncio loop, as procrastinate's own
CLI runs (`asyncio.run`). A fresh database per run (created on the server, dropped after);
procrastinate's schema applied with its schema manager. There is no load before the measurement:
with `--stats fresh` (the default) the installed tables are analysed before the worker starts,
so the planner works from statistics, as on a production server (the benchmark server runs
without autovacuum); `stale` leaves them never analysed. One worker process
(spawned) runs `run_worker_async()` with its defaults — `listen_notify` on — and the given
`--concurrency` (its default, 1, unless told), and is left idle until it has handled a probe
job. This process is the producer: one `defer_async` per job at a steady rate on absolute
deadlines, the arguments carrying the job's number and the time just before the call. Latency
runs from `time.time()` right after the call returned (committed) to `time.time()` on the task's
first line; the worker keeps the start times in memory and writes them to a file when stopped
(SIGTERM, which procrastinate handles gracefully). Jobs of the warm-up are not counted. Prints
one JSON line: p50_ms, p90_ms, p99_ms, max_ms, count (as bench/latency.py), the loop and the
statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import psycopg
from procrastinate import App, PsycopgConnector
from procrastinate.tasks import Task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for the shared figures

from latency_figures import DRAIN_TIMEOUT, percentiles, stop

PROBE = -1
IDLE_BEFORE = 1.0


def declare(url: str, handler: Callable[[int, float], None]) -> tuple[App, Task[Any, Any, Any]]:
    """The app and its one task, declared alike in the producer (which never runs it) and the
    worker."""
    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="latency")
    async def latency(n: int, t: float) -> None:
        handler(n, t)

    return app, latency


async def work(url: str, out: str, handled: Synchronized[int], concurrency: int) -> None:
    started: dict[int, float] = {}

    def record(n: int, _t: float) -> None:
        now = time.time()
        started.setdefault(n, now)
        with handled.get_lock():
            handled.value += 1

    app, _task = declare(url, record)
    try:
        async with app.open_async():
            await app.run_worker_async(concurrency=concurrency)
    finally:
        Path(out).write_text(json.dumps(started))


def worker_child(url: str, out: str, handled: Synchronized[int], concurrency: int) -> None:
    asyncio.run(work(url, out, handled, concurrency))


async def wait_handled(
    handled: Synchronized[int], target: int, timeout: float, worker: BaseProcess
) -> None:
    deadline = time.monotonic() + timeout
    while handled.value < target and time.monotonic() < deadline:
        if not worker.is_alive():
            raise SystemExit(f"the worker process exited (code {worker.exitcode}) mid-run")
        await asyncio.sleep(0.01)


async def produce(
    task: Task[Any, Any, Any], total: int, rate: float
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
        await task.defer_async(n=n, t=stamp)
        after.append(time.time())
        before.append(stamp)
    return before, after, total / (loop.time() - origin)


async def run(
    server: str, seconds: float, rate: float, warmup: float, concurrency: int, *, stats: str
) -> dict[str, Any]:
    warm = round(warmup * rate)
    total = warm + round(seconds * rate)
    name = f"peer_proc_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        url = f"{server.rsplit('/', 1)[0]}/{name}"
        app, task = declare(url, lambda n, t: None)
        context = multiprocessing.get_context("spawn")
        handled: Synchronized[int] = context.Value("q", 0)
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "started.json"
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                if stats == "fresh":
                    with psycopg.connect(url, autocommit=True) as conn:
                        conn.execute("ANALYZE")
                worker = context.Process(
                    target=worker_child, args=(url, str(out), handled, concurrency), daemon=True
                )
                worker.start()
                try:
                    await task.defer_async(n=PROBE, t=0.0)
                    await wait_handled(handled, 1, 60.0, worker)
                    if handled.value < 1:
                        raise SystemExit(
                            "procrastinate: the worker did not handle the probe within 60 s"
                        )
                    await asyncio.sleep(IDLE_BEFORE)
                    before, after, achieved = await produce(task, total, rate)
                    await wait_handled(handled, total + 1, DRAIN_TIMEOUT, worker)
                finally:
                    stop(worker)
            if not out.exists():
                raise SystemExit(
                    f"procrastinate: the worker wrote no start times ({worker.exitcode})"
                )
            started = {int(n): t for n, t in json.loads(out.read_text()).items()}
        return {
            **percentiles("procrastinate", started, before, after, warm),
            "rate": round(achieved, 1),
            "loop": "asyncio",
            "stats": stats,
        }
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=1, help="procrastinate's default: 1")
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE the installed tables before the worker starts; stale: no ANALYZE",
    )
    args = parser.parse_args()
    figures = asyncio.run(
        run(args.server, args.seconds, args.rate, args.warmup, args.concurrency, stats=args.stats)
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
