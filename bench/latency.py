"""Workload 4: latency from enqueue to handler start at a steady rate (p50, p90, p99, max).

    .venv/bin/python bench/latency.py [--seconds 10] [--rate 200] [--warmup 2] [--postgres URL]
                                      [--no-postgres] [--no-sqlite] [--peers [NAME ...]]
                                      [--stats fresh|stale] [--json PATH]

On a fresh database (a new PostgreSQL database, dropped after; a temporary SQLite file), one
worker process is spawned first — `box.work()` with the default `WorkerConfig()`, what `oncebox
worker` runs — and left idle until it has handled a probe job. The benchmark's own process is the
producer, so the worker cannot be woken in-process: it enqueues single keyed jobs (the whole
guarantee path), one `box.enqueue` call each, at a steady `--rate` paced by absolute deadlines
(a late call makes the next wait less; no drift accumulates), for `--warmup` seconds that are not
counted and then `--seconds` that are. No backlog is loaded first; with `--stats fresh` (the
default) each PostgreSQL database — oncebox's and each peer's — is analysed once its schema is
installed, before the worker starts, so the planner works from statistics as on a production
server (the benchmark server runs without autovacuum); `--stats stale` leaves the tables never
analysed. SQLite has no autovacuum to stand in for: its file is never analysed.

The latency of a job runs from `time.time()` taken right after its enqueue call returned (it is
committed and, on PostgreSQL, its NOTIFY sent) to `time.time()` on the first line of its handler
in the worker. The `call` figures run from just before the call instead (the enqueue round trip
added). The handler keeps its start times in memory and the worker writes them to a file when
it is stopped (SIGTERM, graceful), so no measurement goes through the database. Every measured
job must have been handled, or the run fails.

Wake-ups: on PostgreSQL an insert trigger NOTIFYs and the worker's listener thread wakes its
consumer; SQLite has no notifications, so the listener looks at the database files every 50 ms and
wakes the consumer when a commit changed them: expect a p50 near half of that. The peers
(bench/peers/*_latency.py, run in .venv-peers) each run their own default LISTEN/NOTIFY worker in a
process of its own, at any --rate (pgqueuer on uvloop, as its own CLI runs; procrastinate at
concurrency 10, as in bench/compare.py). The table also shows the enqueue call's p50 and the rate
the producer reached: one call at a time, each waiting for its commit, so a slow disk or a busy
machine can hold it below --rate (such rows are named under the table).
Prints the table and, as the last line, one JSON object with every row (also written to --json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import oncebox
from oncebox import Box, JobContext, Task, WorkerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import analyse, postgres_url, sqlite_url
from latency_figures import DRAIN_TIMEOUT, percentiles, stop
from peerrun import PEERS_PYTHON, run_peer

PEERS = {
    # name: (script, arguments): each one's default worker, procrastinate at the concurrency
    # bench/compare.py gives it (its default, 1, keeps up with far less than 200 jobs/s)
    "pgqueuer": ("pgqueuer_latency.py", []),
    "procrastinate": ("procrastinate_latency.py", ["--concurrency", "10"]),
}
PROBE = -1  # the job that tells the worker is up; never counted
IDLE_BEFORE = 1.0  # seconds the ready worker idles before the first timed job


def declare(box: Box, handler: Callable[[int, float], None]) -> Task:
    """The one task, declared alike in the producer (which never runs it) and the worker."""

    @box.task(name="latency", key="latency/{n}")
    def latency(ctx: JobContext, n: int, t: float) -> None:
        handler(n, t)

    return latency


def worker_child(url: str, out: str, handled: Synchronized[int]) -> None:
    """The worker process: default settings; the start times go to `out` when it stops."""
    started: dict[int, float] = {}

    def record(n: int, _t: float) -> None:
        now = time.time()
        started.setdefault(n, now)
        with handled.get_lock():
            handled.value += 1

    box = Box(url)
    declare(box, record)
    try:
        box.work(config=WorkerConfig())
    finally:
        box.close()
        Path(out).write_text(json.dumps(started))


def produce(
    enqueue: Callable[[int, float], object], total: int, rate: float
) -> tuple[list[float], list[float], float]:
    """Enqueue jobs 0..total-1 at `rate` per second on absolute deadlines; returns the stamps
    taken just before and right after each call, and the rate achieved."""
    before: list[float] = []
    after: list[float] = []
    origin = time.perf_counter()
    for n in range(total):
        delay = origin + n / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        stamp = time.time()
        enqueue(n, stamp)
        after.append(time.time())
        before.append(stamp)
    return before, after, total / (time.perf_counter() - origin)


def wait_handled(
    handled: Synchronized[int], target: int, timeout: float, worker: BaseProcess
) -> None:
    deadline = time.monotonic() + timeout
    while handled.value < target and time.monotonic() < deadline:
        if not worker.is_alive():
            raise SystemExit(f"the worker process exited (code {worker.exitcode}) mid-run")
        time.sleep(0.01)  # a benchmark's window, not a test's synchronisation


def measure_oncebox(
    make_url: Callable[[], AbstractContextManager[str]],
    seconds: float,
    rate: float,
    warmup: float = 2.0,
    *,
    stats: str = "fresh",
) -> dict[str, Any]:
    """Workload 4 for oncebox on the store `make_url` gives (`core.sqlite_url`,
    `core.postgres_url(server)`): the pick-up latency figures and the count. `stats`: "fresh"
    analyses a PostgreSQL database before the worker starts; "stale" does not."""
    warm = round(warmup * rate)
    total = warm + round(seconds * rate)
    context = multiprocessing.get_context("spawn")
    handled: Synchronized[int] = context.Value("q", 0)
    with make_url() as url, tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "started.json"
        box = Box(url)
        task = declare(box, lambda n, t: None)
        if stats == "fresh":
            analyse(url)  # a no-op on SQLite
        worker = context.Process(target=worker_child, args=(url, str(out), handled), daemon=True)
        worker.start()
        try:
            box.enqueue(task, n=PROBE, t=time.time())
            wait_handled(handled, 1, 60.0, worker)
            if handled.value < 1:
                raise SystemExit("the worker did not handle the probe job within 60 s")
            time.sleep(IDLE_BEFORE)
            before, after, achieved = produce(lambda n, t: box.enqueue(task, n=n, t=t), total, rate)
            wait_handled(handled, total + 1, DRAIN_TIMEOUT, worker)
        finally:
            stop(worker)
            box.close()
        if not out.exists():
            raise SystemExit(f"the worker wrote no start times (exit code {worker.exitcode})")
        started = {int(n): t for n, t in json.loads(out.read_text()).items()}
    return {
        **percentiles("oncebox", started, before, after, warm),
        "rate": round(achieved, 1),
        "stats": stats,
    }


def measure_peer(
    name: str,
    server: str,
    seconds: float,
    rate: float,
    warmup: float = 2.0,
    *,
    stats: str = "fresh",
) -> dict[str, Any]:
    """Workload 4 for a peer, in .venv-peers, on a fresh database of `server`, at any rate."""
    script, extra = PEERS[name]
    timing = ["--seconds", str(seconds), "--rate", str(rate), "--warmup", str(warmup)]
    return run_peer(
        name,
        script,
        server,
        [*timing, *extra, "--stats", stats],
        timeout=seconds + warmup + 300,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--peers", nargs="*", default=sorted(PEERS), choices=sorted(PEERS))
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE each PostgreSQL database before its worker starts; stale: never",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    stores: dict[str, Callable[[], AbstractContextManager[str]]] = {}
    if not args.no_postgres:
        stores["postgres"] = postgres_url(args.postgres)
    if not args.no_sqlite:
        stores["sqlite"] = sqlite_url
    rows: list[dict[str, Any]] = []
    for store, make in stores.items():
        figures = measure_oncebox(make, args.seconds, args.rate, args.warmup, stats=args.stats)
        rows.append({"library": "oncebox", "store": store, **figures})
    installed = PEERS_PYTHON.exists()
    if not args.no_postgres and installed:
        for peer in args.peers:
            figures = measure_peer(
                peer, args.postgres, args.seconds, args.rate, args.warmup, stats=args.stats
            )
            rows.append({"library": peer, "store": "postgres", **figures})
    print(
        f"enqueue → handler start · {args.rate:g} jobs/s for {args.seconds:g} s "
        f"(warm-up {args.warmup:g} s not counted) · {args.stats} statistics · "
        f"oncebox {oncebox.__version__} · "
        f"Python {platform.python_version()} · {platform.machine()}"
    )
    print(
        f"{'library/store':<24}{'jobs':>6}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'call p50':>10}{'enqueue':>9}{'rate/s':>8}"
    )
    for row in rows:
        print(
            f"{row['library'] + '/' + row['store']:<24}{row['count']:>6}{row['p50_ms']:>9.1f}"
            f"{row['p90_ms']:>9.1f}{row['p99_ms']:>9.1f}{row['max_ms']:>9.1f}"
            f"{row['call_p50_ms']:>10.1f}{row['enqueue_p50_ms']:>9.2f}{row['rate']:>8.0f}"
        )
    short = [f"{r['library']}/{r['store']}" for r in rows if r["rate"] < 0.95 * args.rate]
    if short:
        print(
            f"producer below {args.rate:g}/s (one enqueue at a time, each waiting for its "
            f"commit): {', '.join(short)}"
        )
    if args.peers and not installed:
        print("peers not installed: run `make peers-env` to compare")
    report = {
        "seconds": args.seconds,
        "rate": args.rate,
        "warmup": args.warmup,
        "stats": args.stats,
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
