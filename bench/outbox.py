"""Outbox benchmark: dispatch throughput and the full guarantee path, on SQLite and PostgreSQL.

    .venv/bin/python bench/outbox.py [--jobs 20000] [--smtp-jobs 2000] [--repeat 3] [--json PATH]

Workloads (each on a fresh database, median of --repeat runs):
- dispatch/null: outbox rows already written; one dispatcher delivers them to the null provider
  (idempotent: outcomes recorded per batch);
- dispatch/smtp: the same to a real SMTP server on loopback (aiosmtpd), one connection per message,
  the `sending` marker and the outcome each a commit;
- full path: jobs enqueued; one worker process runs a consumer (claim the key, write the outbox
  row, complete) and a dispatcher (lease, send to the null provider, record the receipt)
  concurrently; timed from the worker's start to the last receipt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import analyse, postgres_url, sqlite_url

import oncebox
from oncebox import Box, WorkerConfig
from oncebox.fakes.smtp_sink import SmtpSink
from oncebox.lanes.dispatcher import DispatcherConfig

SECRET = "bench-secret-0123456789"  # noqa: S105 (a benchmark's throwaway secret)


def make_box(url: str, provider: str) -> Box:
    box = Box(url, secret=SECRET)
    box.channel("email", provider=provider)

    @box.task(key="bench/{n}")
    def mail(ctx: oncebox.JobContext, n: int) -> None:
        ctx.outbox.email(to=f"c{n}@bench.example", subject="digest", text="hello")

    return box


def write_rows(box: Box, jobs: int) -> None:
    box.enqueue_many("mail", [{"n": i} for i in range(jobs)])
    box.work(config=WorkerConfig(until_idle=True, dispatch=False))


def dispatch(url: str, jobs: int, provider: str) -> float:
    box = make_box(url, provider)
    try:
        write_rows(box, jobs)
        dispatcher = box.dispatcher(DispatcherConfig(batch_size=200))
        started = time.perf_counter()
        sent = 0
        while sent < jobs:
            result = dispatcher.run_once()
            if not result.leased:
                break
            sent += result.sent
        elapsed = time.perf_counter() - started
        assert sent == jobs, (sent, jobs)
        return jobs / elapsed
    finally:
        box.close()


def full_path(url: str, jobs: int, concurrency: int = 1, stats: str = "fresh") -> float:
    box = make_box(url, "null:")
    try:
        box.enqueue_many("mail", [{"n": i} for i in range(jobs)])
        if stats == "fresh":
            analyse(url)  # as autovacuum would have by then
        started = time.perf_counter()
        work_full(box, jobs, concurrency)
        elapsed = time.perf_counter() - started
        return jobs / elapsed
    finally:
        box.close()


def work_full(box: Box, jobs: int, concurrency: int = 1) -> None:
    """The full path's work, once `jobs` are enqueued: one worker (consumer and dispatcher)
    until idle; every job completed and every message sent."""
    result = box.work(config=WorkerConfig(until_idle=True, concurrency=concurrency))
    assert result.consumed.completed == jobs and result.dispatched.sent == jobs, result


def median(
    make: Callable[[], AbstractContextManager[str]], run: Callable[[str], float], repeat: int
) -> float:
    figures = []
    for _ in range(repeat):
        with make() as url:
            figures.append(run(url))
    return statistics.median(figures)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--smtp-jobs", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stores: dict[str, Callable[[], AbstractContextManager[str]]] = {"sqlite": sqlite_url}
    if not args.no_postgres:
        stores["postgres"] = postgres_url(args.postgres)
    rows = []
    with SmtpSink() as sink:
        for store, make in stores.items():
            workloads: list[tuple[str, int, Callable[[str], float]]] = [
                ("dispatch/null", args.jobs, lambda url: dispatch(url, args.jobs, "null:")),
                (
                    "dispatch/smtp",
                    args.smtp_jobs,
                    lambda url: dispatch(url, args.smtp_jobs, sink.url),
                ),
                ("full path", args.jobs, lambda url: full_path(url, args.jobs)),
            ]
            for name, n, run in workloads:
                rows.append(
                    {
                        "store": store,
                        "workload": name,
                        "n": n,
                        "per_s": round(median(make, run, args.repeat)),
                    }
                )
    print(f"oncebox {oncebox.__version__} · median of {args.repeat}")
    print(f"{'store':<10}{'workload':<16}{'messages':>10}{'per second':>12}")
    for row in rows:
        print(f"{row['store']:<10}{row['workload']:<16}{row['n']:>10,}{row['per_s']:>12,}")
    if args.json:
        args.json.write_text(json.dumps({"repeat": args.repeat, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
