"""The worker's own Python per job: CPU time per job of the worker and of its consumer lane.

    .venv/bin/python bench/worker_python.py [--store pg|sqlite|both] [--workload noop|full|both]
        [--jobs 20000] [--repeat 3] [--profile] [--top 25] [--framework]

Workloads (each round on a fresh database: a new PostgreSQL database on the server, dropped
after, or a temporary SQLite file; jobs bulk-enqueued and the tables analysed before timing):
- noop: keyed no-op jobs (`bench/core.py`'s keyed row): lease, claim the key, run an empty
  handler, settle;
- full: the full guarantee path (`bench/outbox.py`): each handler writes a digest email to the
  outbox (`ctx.outbox.email`), and the worker's dispatcher sends it to the null provider.

One worker (`box.work(until_idle=True)`, one consumer lane, default settings). Figures, in
µs per job, medians of the rounds:
- `process`: the worker process's CPU time (user + system, every thread: the lanes, the
  listener, the lease keeper, and on SQLite the database engine itself, which runs in-process);
- `consumer`: the consumer lane's own thread's CPU time (`time.thread_time` around each of its
  rounds): the lease, the framework around each handler, the handler, the settlement;
- `wall`: elapsed time per job, for scale (it swings with the machine; the CPU figures much less).

`--profile` runs one more round with cProfile in the consumer lane's thread and prints its
costliest functions by their own time (cProfile slows Python several-fold: read shares, not
µs), then the share spent in the database driver against the rest.

`--framework` measures the framework alone, without the driver, the server or a busy machine's
waits: the real consumer lane (lease rows made records and deliveries, arguments decoded and
checked, each handler's guarded connection, savepoint scope and watchdog mark, the claim's,
outbox's and settlement's JSON sets, the settlement's bookkeeping) and the real PostgreSQL
consumer session, over a connection that answers from memory: the lease returns `--batch`
prepared rows, the claim claims every key and the settlement settles every job. Each round is
one `run_once` of a full batch; the figure is the fastest round's thread CPU per job (the
least disturbed by other processes), with the 10th percentile and the median beside it. It
reaches into the session's private parts (`_lease`, `_conn`): a bench, not an API.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import analyse, postgres_url, sqlite_url

import oncebox
from oncebox import Box, WorkerConfig
from oncebox.lanes.consumer import Consumer, ConsumerConfig
from oncebox.queue.transport import TableTransport
from oncebox.store.postgres import PostgresConsumerSession
from oncebox.store.records import LeasedJob
from oncebox.store.rows import Result

SECRET = "bench-secret-0123456789"  # noqa: S105 (a benchmark's throwaway secret)


def make_box(url: str, workload: str) -> Box:
    box = Box(url, secret=SECRET)
    if workload == "noop":

        @box.task(name="job", key="bench/{n}")
        def noop(ctx: oncebox.JobContext, n: int) -> None:
            pass

    else:
        box.channel("email", provider="null:")

        @box.task(name="job", key="bench/{n}")
        def mail(ctx: oncebox.JobContext, n: int) -> None:
            ctx.outbox.email(to=f"c{n}@bench.example", subject="digest", text="hello")

    return box


@contextmanager
def consumer_clock(profiler: cProfile.Profile | None) -> Iterator[list[float]]:
    """Sum the consumer lane's thread CPU over its rounds (and profile them, if asked)."""
    spent = [0.0]
    original = Consumer.run_once

    def timed(self: Consumer) -> Any:
        if profiler is not None:
            profiler.enable()
        began = time.thread_time()
        try:
            return original(self)
        finally:
            spent[0] += time.thread_time() - began
            if profiler is not None:
                profiler.disable()

    Consumer.run_once = timed  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        Consumer.run_once = original  # type: ignore[method-assign]


def run_once(
    url: str, workload: str, jobs: int, profiler: cProfile.Profile | None = None
) -> dict[str, float]:
    box = make_box(url, workload)
    try:
        created = box.enqueue_many("job", [{"n": i} for i in range(jobs)]).created
        assert created == jobs
        analyse(url)  # as autovacuum would have by then
        with consumer_clock(profiler) as consumer:
            cpu, wall = time.process_time(), time.perf_counter()
            result = box.work(config=WorkerConfig(until_idle=True))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert result.consumed.completed == jobs, result
        if workload == "full":
            assert result.dispatched.sent == jobs, result
        micro = 1e6 / jobs
        return {"process": cpu * micro, "consumer": consumer[0] * micro, "wall": wall * micro}
    finally:
        box.close()


class _Rows(list[tuple[Any, ...]]):
    """What `execute` returns here: a cursor, read for its rows."""

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self


class _MemoryConnection:
    """Enough of a psycopg connection for a consumer transaction whose answers are known: the
    claim returns every key of the batch, the settlement every id."""

    closed = broken = False

    def __init__(self, answers: dict[str, list[tuple[Any, ...]]]) -> None:
        self.answers = answers

    def execute(self, sql: Any, params: Any = None) -> _Rows:
        return _Rows(self.answers.get(sql, ()))

    def commit(self) -> None:
        pass

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        yield


def framework(workload: str, batch: int, rounds: int) -> dict[str, float]:
    """See the module's docstring, `--framework`."""
    with postgres_url(SERVER)() as url:
        box = make_box(url, workload)
        try:
            store: Any = box.store
            now = datetime.now(UTC)
            names = [f.name for f in dataclasses.fields(LeasedJob)]
            ids = range(1, batch + 1)
            rows = [
                (i, f"bench/{i}", "job", json.dumps({"n": i}), 1, 5, 0, 0, now, None, now, None)
                for i in ids
            ]
            q = store._q
            session: Any = object.__new__(PostgresConsumerSession)
            session._store, session._q, session._settings = store, q, None
            session._ran_dry, session._due = False, None
            session._conn = _MemoryConnection(
                {
                    q["intent_claim"]: [(f"bench/{i}",) for i in ids],
                    q["job_finish"]: [(i,) for i in ids],
                }
            )
            session._lease = lambda _values: Result("memory lease", list(rows), lambda: names)
            consumer = box.consumer(ConsumerConfig(batch_size=batch, max_batch_size=batch))
            consumer.session.close()
            consumer.session = session
            consumer.transport = TableTransport(
                session,
                tasks=["job"],
                queues=["default"],
                worker="bench",
                lease_for=timedelta(seconds=30),
                next_due=lambda _tasks, _queues: None,  # type: ignore[arg-type]
            )
            times = []
            for round_ in range(rounds + rounds // 10):
                began = time.thread_time()
                done = consumer.run_once()
                if round_ >= rounds // 10:  # the first tenth warms up
                    times.append(time.thread_time() - began)
                assert done.completed == batch, done
        finally:
            box.close()
    times.sort()
    micro = 1e6 / batch
    return {
        "min": times[0] * micro,
        "p10": times[len(times) // 10] * micro,
        "median": times[len(times) // 2] * micro,
    }


SERVER = "postgresql://127.0.0.1:5432/test"
DRIVER = ("psycopg", "sqlite3", "psycopg_binary", "psycopg_c")


def is_driver(func: tuple[str, int, str]) -> bool:
    path, _line, name = func
    return any(part in path for part in DRIVER) or (
        path == "~" and any(part in name for part in DRIVER)
    )


def report_profile(profiler: cProfile.Profile, jobs: int, top: int) -> None:
    stats = pstats.Stats(profiler)
    entries: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in entries.values())
    driver = sum(entry[2] for func, entry in entries.items() if is_driver(func))
    print(
        f"\nprofile of the consumer lane (cProfile; {total * 1e6 / jobs:.0f} µs/job under the "
        f"profiler): in the driver {driver / total:.0%}, the rest {1 - driver / total:.0%}"
    )
    print(f"{'own µs/job':>11}{'share':>7}{'calls/job':>10}  function")
    ranked = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)
    for (path, line, name), (_cc, calls, tottime, _ct, _callers) in ranked[:top]:
        where = name if path == "~" else f"{shorten(path)}:{line} {name}"
        print(f"{tottime * 1e6 / jobs:>11.1f}{tottime / total:>7.1%}{calls / jobs:>10.2f}  {where}")


def shorten(path: str) -> str:
    for marker in ("/src/oncebox/", "/site-packages/", "/lib/python"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def stores(store: str, server: str) -> dict[str, Callable[[], AbstractContextManager[str]]]:
    made: dict[str, Callable[[], AbstractContextManager[str]]] = {}
    if store in ("sqlite", "both"):
        made["sqlite"] = sqlite_url
    if store in ("pg", "both"):
        made["pg"] = postgres_url(server)
    return made


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--store", choices=("pg", "sqlite", "both"), default="both")
    parser.add_argument("--workload", choices=("noop", "full", "both"), default="both")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--framework", action="store_true")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args()
    workloads = ("noop", "full") if args.workload == "both" else (args.workload,)
    if args.framework:
        global SERVER  # noqa: PLW0603 (the one server of this run)
        SERVER = args.postgres
        print(
            f"oncebox {oncebox.__version__} ({Path(oncebox.__file__).parent}) · framework only "
            f"(PostgreSQL session, answers from memory) · batches of {args.batch} · "
            f"{args.rounds} rounds · µs of CPU per job"
        )
        print(f"{'workload':<10}{'fastest':>9}{'p10':>8}{'median':>8}")
        for workload in workloads:
            f = framework(workload, args.batch, args.rounds)
            print(f"{workload:<10}{f['min']:>9.1f}{f['p10']:>8.1f}{f['median']:>8.1f}", flush=True)
        return 0
    print(
        f"oncebox {oncebox.__version__} ({Path(oncebox.__file__).parent}) · {args.jobs} jobs · "
        f"median of {args.repeat} · µs of CPU per job"
    )
    print(f"{'store':<8}{'workload':<10}{'process':>9}{'consumer':>10}{'wall':>8}   rounds")
    for store, make in stores(args.store, args.postgres).items():
        for workload in workloads:
            runs = []
            for _ in range(args.repeat):
                with make() as url:
                    runs.append(run_once(url, workload, args.jobs))
            median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rounds = " ".join(f"{r['process']:.0f}/{r['consumer']:.0f}" for r in runs)
            print(
                f"{store:<8}{workload:<10}{median['process']:>9.1f}{median['consumer']:>10.1f}"
                f"{median['wall']:>8.1f}   {rounds}",
                flush=True,
            )
            if args.profile:
                profiler = cProfile.Profile(time.thread_time)  # CPU, not waits
                with make() as url:
                    run_once(url, workload, args.jobs, profiler)
                report_profile(profiler, args.jobs, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
