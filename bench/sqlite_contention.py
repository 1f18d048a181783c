"""SQLite writer contention: can the app that embeds oncebox still enqueue while a worker drains?

    .venv/bin/python bench/sqlite_contention.py [--jobs 600] [--enqueues 100] [--writers 5]
                                                [--json PATH]

One SQLite file (the embedded default, default busy timeout). A worker process drains `--jobs`
jobs whose handlers take 5 to 50 ms each (uniform, seeded) with one consumer. Twice, on fresh
files: once alone (the baseline), and once while `--writers` other processes make `--enqueues`
enqueues between them, one at a time each, as `oncebox enqueue` or a web request would. Reported:

- enqueues that succeeded, and how long each waited (p50, p99, max), in the other processes;
- the worker's throughput with them against without (a ratio: the target is ≥ 0.8);
- leases that expired for want of the write lock (attempts recorded as `lease_expired`; the
  target is none).

The figures go to stdout and, with --json, to a file (docs/benchmarks.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SPAWN = multiprocessing.get_context("spawn")
HANDLER_MS = (5, 50)


def build(url: str) -> Any:
    from oncebox import Box

    box = Box(url)

    @box.task(key="drain/{n}", queue="drain")
    def drain(ctx: Any, n: int) -> None:
        time.sleep(random.Random(n).uniform(*HANDLER_MS) / 1000)  # the handler's own work

    @box.task(key="note/{n}", queue="app")
    def note(ctx: Any, n: int) -> None:
        pass

    return box


def work(url: str, out: Any) -> None:
    """The worker process: drain the `drain` queue until idle; report its time."""
    from oncebox import WorkerConfig

    box = build(url)
    started = time.perf_counter()
    result = box.work(config=WorkerConfig(until_idle=True, queues=("drain",)))
    out.put((time.perf_counter() - started, result.consumed.completed))
    box.close()


def enqueuer(url: str, span: tuple[int, int], ready: Any, start: Any, out: Any) -> None:
    """Another process of the app: enqueues `span` (first, count), one at a time, each timed."""
    first, count = span
    from oncebox.kernel.errors import StoreUnavailable

    box = build(url)
    ready.put(first)
    start.wait()
    pause = random.Random(first)
    for n in range(first, first + count):
        began = time.perf_counter()
        try:
            box.enqueue("note", n=n)
            out.put(("ok", time.perf_counter() - began))
        except StoreUnavailable as exc:
            out.put(("failed", time.perf_counter() - began, str(exc)[:200]))
        time.sleep(pause.uniform(0.02, 0.12))  # the app's own pace between two requests
    box.close()


def run(jobs: int, enqueues: int, writers: int, contended: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="oncebox-contention-") as folder:
        url = f"sqlite:///{Path(folder) / 'app.db'}"
        box = build(url)
        box.enqueue_many("drain", [{"n": n} for n in range(jobs)])
        box.close()
        results, done, ready = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Queue()
        start = SPAWN.Event()
        worker = SPAWN.Process(target=work, args=(url, done))
        apps = []
        if contended:
            share = [enqueues // writers + (i < enqueues % writers) for i in range(writers)]
            firsts = [sum(share[:i]) for i in range(writers)]
            apps = [
                SPAWN.Process(
                    target=enqueuer, args=(url, (firsts[i], share[i]), ready, start, results)
                )
                for i in range(writers)
            ]
            for app in apps:
                app.start()
            for _app in apps:  # each has imported and opened the database
                ready.get(timeout=120)
        worker.start()
        start.set()
        seconds, completed = done.get(timeout=3600)
        worker.join(60)
        for app in apps:
            app.join(600)
        waits, failures = [], []
        while not results.empty():
            item = results.get()
            (waits if item[0] == "ok" else failures).append(item)
        box = build(url)
        conn = box.store.connect()  # type: ignore[attr-defined]
        expired = conn.execute(
            "SELECT count(*) FROM oncebox_job_attempts WHERE outcome = 'lease_expired'"
        ).fetchone()[0]
        conn.close()
        box.close()
    ok = sorted(w[1] for w in waits)
    return {
        "jobs": jobs,
        "completed": completed,
        "throughput": completed / seconds,
        "enqueues": len(ok) + len(failures),
        "enqueued": len(ok),
        "failed": len(failures),
        "failure": failures[0][2] if failures else None,
        "wait_p50_ms": 1000 * statistics.median(ok) if ok else None,
        "wait_p99_ms": 1000 * ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
        "wait_max_ms": 1000 * ok[-1] if ok else None,
        "leases_expired": expired,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--enqueues", type=int, default=100)
    parser.add_argument("--writers", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    alone = run(args.jobs, 0, args.writers, contended=False)
    shared = run(args.jobs, args.enqueues, args.writers, contended=True)
    ratio = shared["throughput"] / alone["throughput"]
    print(f"worker alone:            {alone['throughput']:.1f} jobs/s ({alone['jobs']} jobs)")
    print(
        f"worker with {args.writers} writers:  {shared['throughput']:.1f} jobs/s "
        f"= {ratio:.2f} x alone (target >= 0.80)"
    )
    print(
        f"enqueues:                {shared['enqueued']} of {shared['enqueues']} succeeded"
        + (f" ({shared['failed']} failed: {shared['failure']})" if shared["failed"] else "")
    )
    if shared["enqueued"]:
        print(
            f"enqueue wait:            p50 {shared['wait_p50_ms']:.1f} ms, "
            f"p99 {shared['wait_p99_ms']:.1f} ms (target < 1000), "
            f"max {shared['wait_max_ms']:.1f} ms"
        )
    print(f"leases expired:          {alone['leases_expired'] + shared['leases_expired']}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": platform.platform(),
                    "python": platform.python_version(),
                    "alone": alone,
                    "contended": shared,
                    "throughput_ratio": ratio,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
