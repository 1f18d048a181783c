"""Workload 5: no-op throughput with a large backlog (1 000 000 jobs) against a small one (10 000).

    .venv/bin/python bench/backlog.py [--small 10000] [--large 1000000] [--measure 10000]
                                      [--repeat 1] [--stats fresh|stale] [--postgres URL]
                                      [--peers [NAME ...]] [--json PATH]

For each backlog size B, on a fresh PostgreSQL database: B keyed no-op jobs are enqueued with
`box.enqueue_many` (in chunks of --chunk), then one consumer lane (`box.consumer()`, default
settings) processes the first M = --measure of them, `run_once()` after `run_once()`, and the
figure is M / seconds. The same M at both sizes, so the ratio large / small shows what the backlog
alone costs; the target is >= 0.8. Planner statistics: with `--stats fresh` (the default) the
database is analysed between the enqueue and the measurement, for every library — the statistics
a production server would have by then, from autovacuum (the benchmark server runs without it);
`--stats stale` leaves them as the enqueue left them (the workers of a Monday-morning fan-out
that start at once). How many times the jobs table had been analysed (by hand, ours included, or
by autovacuum) when the measurement started and when it ended is reported. The peers run the same
workload in their own interpreter (.venv-peers) from bench/peers/*_backlog.py (pgqueuer on
uvloop, as its own CLI runs). The figure is the median of --repeat rounds. A table prints per
library, and the last stdout line is one JSON object with every row.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import analyse, postgres_url
from peerrun import PEERS_PYTHON, run_peer

import oncebox
from oncebox import Box

PEERS = {
    # name: (script, arguments for its best documented single-worker setting)
    "pgqueuer": ("pgqueuer_backlog.py", ["--batch", "100"]),
    "procrastinate": ("procrastinate_backlog.py", ["--concurrency", "10"]),
}
CHUNK = 100_000


def analyzed(url: str, table: str) -> int:
    """How many times the table has been analysed (by hand or by autovacuum) so far."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables WHERE relname = %s",
            (table,),
        ).fetchone()
    return int(row[0]) if row else 0


def run_oncebox(
    url: str, backlog: int, measure: int, chunk: int = CHUNK, *, stats: str = "fresh"
) -> dict[str, Any]:
    """Enqueue `backlog` keyed no-op jobs, then time one consumer over the first `measure`.
    `stats`: "fresh" analyses the database after the load, as autovacuum would; "stale" does
    not."""
    box = Box(url)
    try:
        first: list[float] = []

        @box.task(key="bench/{n}")
        def noop(ctx: oncebox.JobContext, n: int) -> None:
            if not first:
                first.append(time.perf_counter())

        started = time.perf_counter()
        for offset in range(0, backlog, chunk):
            count = min(chunk, backlog - offset)
            args = [{"n": i} for i in range(offset, offset + count)]
            assert box.enqueue_many("noop", args).created == count
        enqueued = time.perf_counter() - started
        analysed = 0.0
        if stats == "fresh":
            started = time.perf_counter()
            analyse(url)
            analysed = time.perf_counter() - started
        analyzed_before = analyzed(url, "oncebox_jobs")

        before = box.metrics.operations()
        consumer = box.consumer()
        done = batches = 0
        slowest = 0.0
        started = time.perf_counter()
        try:
            while done < measure:
                began = time.perf_counter()
                result = consumer.run_once()
                took = time.perf_counter() - began
                if not result.leased:
                    raise SystemExit(f"oncebox: backlog ran dry after {done} of {measure} jobs")
                slowest = max(slowest, took)
                done += result.completed
                batches += 1
        finally:
            consumer.session.close()
        processed = time.perf_counter() - started
        lease = box.metrics.operations()["job_lease"]
        leased_before = before.get("job_lease")
        lease_s = lease.seconds - (leased_before.seconds if leased_before else 0.0)
        return {
            "enqueue_s": enqueued,
            "enqueue_per_s": backlog / enqueued,
            "analyze_s": analysed,
            "processed": done,
            "process_s": processed,
            "process_per_s": done / processed,
            "first_job_s": first[0] - started,
            "slowest_batch_s": slowest,
            "batches": batches,
            "lease_s": lease_s,
            "lease_max_s": lease.max_seconds,
            "analyzed_before": analyzed_before,
            "analyzed_after": analyzed(url, "oncebox_jobs"),
            "stats": stats,
        }
    finally:
        box.close()


def measure_oncebox(
    server: str, backlog: int, measure: int, *, stats: str = "fresh"
) -> dict[str, Any]:
    """Workload 5 for oncebox on a fresh database of `server`: one backlog size, one run."""
    with postgres_url(server)() as url:
        return run_oncebox(url, backlog, measure, stats=stats)


def measure_peer(
    name: str, server: str, backlog: int, measure: int, *, stats: str = "fresh"
) -> dict[str, Any]:
    """Workload 5 for a peer, run in .venv-peers: one backlog size, one run."""
    script, extra = PEERS[name]
    sizes = ["--backlog", str(backlog), "--measure", str(measure)]
    return run_peer(name, script, server, [*sizes, *extra, "--stats", stats], timeout=7200)


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the runs; a label ("loop", "stats") as the runs give it."""
    return {
        k: statistics.median(r[k] for r in runs)
        if isinstance(runs[0][k], int | float)
        else runs[0][k]
        for k in runs[0]
    }


def rounded(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 4) if isinstance(v, int | float) else v for k, v in figures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--measure", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--stats",
        choices=["fresh", "stale"],
        default="fresh",
        help="fresh: ANALYZE after the enqueue, as autovacuum would; stale: no ANALYZE",
    )
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument(
        "--peers",
        nargs="*",
        default=["pgqueuer"],
        choices=sorted(PEERS),
        help="procrastinate is not run by default: about 2 jobs/s at a 1M backlog (~1.5 h)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not 0 < args.measure <= min(args.small, args.large):
        parser.error("--measure must be positive and at most both backlog sizes")
    installed = PEERS_PYTHON.exists()
    peers = [p for p in args.peers if installed]
    sizes = {"small": args.small, "large": args.large}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _round in range(args.repeat):
        for size, backlog in sizes.items():
            for library in ["oncebox", *peers]:
                if library == "oncebox":
                    figures = measure_oncebox(
                        args.postgres, backlog, args.measure, stats=args.stats
                    )
                else:
                    figures = measure_peer(
                        library, args.postgres, backlog, args.measure, stats=args.stats
                    )
                runs.setdefault((library, size), []).append(figures)
                # progress on stderr, so a long run shows (and keeps) its figures as they come
                print(f"{library} backlog {backlog}: {json.dumps(figures)}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for library in ["oncebox", *peers]:
        small, large = median(runs[library, "small"]), median(runs[library, "large"])
        rows.append(
            {
                "library": library,
                "small_per_s": round(small["process_per_s"]),
                "large_per_s": round(large["process_per_s"]),
                "ratio": round(large["process_per_s"] / small["process_per_s"], 2),
                "large_enqueue_s": round(large["enqueue_s"], 1),
                "large_enqueue_per_s": round(large["enqueue_per_s"]),
                "small_first_job_s": round(small["first_job_s"], 3),
                "large_first_job_s": round(large["first_job_s"], 3),
                "large_analyzed": large["analyzed_after"] > 0,
                "small": rounded(small),
                "large": rounded(large),
            }
        )
    print(
        f"PostgreSQL · backlog {args.small:,} vs {args.large:,} · first {args.measure:,} "
        f"processed · {args.stats} statistics · median of {args.repeat} · "
        f"oncebox {oncebox.__version__} · "
        f"Python {platform.python_version()} · {platform.machine()}"
    )
    print(
        f"{'library':<15}{'small /s':>10}{'large /s':>10}{'large÷small':>13}"
        f"{'large enqueue s':>17}{'1st job s (S/L)':>17}"
    )
    for row in rows:
        first = f"{row['small_first_job_s']:.3f}/{row['large_first_job_s']:.3f}"
        print(
            f"{row['library']:<15}{row['small_per_s']:>10,}{row['large_per_s']:>10,}"
            f"{row['ratio']:>13}{row['large_enqueue_s']:>17}{first:>17}"
        )
    if not installed:
        print("peers not installed: run `make peers-env` to compare")
    report = {
        "small": args.small,
        "large": args.large,
        "measure": args.measure,
        "repeat": args.repeat,
        "stats": args.stats,
        "machine": f"{platform.node()} {platform.machine()}",
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
