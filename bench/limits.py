"""What limits on tasks cost: beside a saturated backlog, per limited lease, and per job.

    .venv/bin/python bench/limits.py [--waiting 100000] [--partitions 10 1000 10000]
                                     [--measure 5000] [--rounds 3] [--postgres URL]
                                     [--peers [pgqueuer]] [--json bench/results/limits.json]

On fresh PostgreSQL databases, the statistics analysed after each load (as autovacuum would:
the benchmark server runs without it):

1. *beside*: one consumer lane's keyed no-op throughput over --measure jobs of a task no limit
   holds, alone and then beside --waiting jobs of a limited task held back by a full
   `Concurrency(1)` (one of its jobs leased and never settled). The ratio is what a saturated
   limited backlog costs everyone else; the limited jobs are not in the claim index.
2. *blocked lease*: the time of one lease that finds the limit full, with the --waiting jobs
   spread over each of --partitions partitions (a per-partition limit): what an idle lane's poll
   costs while everything waits. The survey reads one index probe per partition.
3. *per job*: the throughput of a task under `Concurrency(1000)` (a limit that never binds) and
   under `Rate("1000000/s")`, against the same task unlimited, one lane each. A job holding a
   slot is leased alone (a batch would hold its slot while the rest runs), so the concurrency
   row pays a lease and a transaction per job; the rate row leases in batches.
4. the peer: pgqueuer (run in .venv-peers) no-op throughput with `concurrency_limit=1000` on its
   entrypoint against none, one worker at its default batch, for the same ratio.

Each figure is the median of --rounds rounds; ratios are taken within a round.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from core import analyse, postgres_url
from peerrun import PEERS_PYTHON, run_peer

import oncebox
from oncebox import Box, Concurrency, Rate

CHUNK = 50_000


def declare(box: Box, limits: list[Any] | None, *, partition: bool = False) -> None:
    """`work` (keyed no-op, the measured task) and `held` (the limited backlog's)."""

    @box.task(key="work/{n}", limits=limits)
    def work(ctx: oncebox.JobContext, n: int) -> None:
        pass

    held_limits = [Concurrency(1, per_partition=True)] if partition else [Concurrency(1)]

    @box.task(key="held/{n}", limits=held_limits, partition="{tenant}" if partition else None)
    def held(ctx: oncebox.JobContext, n: int, tenant: str) -> None:
        pass


def load(box: Box, task: str, count: int, make: Callable[[int], dict[str, Any]]) -> None:
    for offset in range(0, count, CHUNK):
        args = [make(n) for n in range(offset, min(count, offset + CHUNK))]
        assert box.enqueue_many(task, args).created == len(args)


def hold_slots(url: str) -> None:
    """Lease one `held` job per partition and never settle it: every limit is full. Written
    here in one statement (a lease per partition would survey every partition each time)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE oncebox_jobs SET state = 'leased', attempt = attempt + 1, leased_by = 'holder',"
            " leased_at = now(), lease_token = gen_random_uuid(),"
            " lease_expires_at = now() + interval '1 day'"
            " WHERE id IN (SELECT DISTINCT ON (limit_key) id FROM oncebox_jobs"
            "              WHERE task = 'held' AND state = 'ready' ORDER BY limit_key, id)"
        )


def throughput(box: Box, measure: int) -> float:
    consumer = box.consumer()
    done = 0
    started = time.perf_counter()
    try:
        while done < measure:
            result = consumer.run_once()
            if not result.leased:
                raise SystemExit(f"ran dry after {done} of {measure} jobs")
            done += result.completed
    finally:
        consumer.session.close()
    return done / (time.perf_counter() - started)


def beside(server: str, waiting: int, measure: int) -> dict[str, float]:
    figures = {}
    for name, held in (("alone", 0), ("beside", waiting)):
        with postgres_url(server)() as url:
            box = Box(url)
            try:
                declare(box, None)
                load(box, "work", measure, lambda n: {"n": n})
                if held:
                    load(box, "held", held, lambda n: {"n": n, "tenant": "t"})
                analyse(url)
                if held:
                    hold_slots(url)
                figures[name] = throughput(box, measure)
            finally:
                box.close()
    figures["ratio"] = figures["beside"] / figures["alone"]
    return figures


def blocked_lease(server: str, waiting: int, partitions: int, leases: int = 50) -> float:
    """Median seconds of a lease that finds every partition's limit full."""
    with postgres_url(server)() as url:
        box = Box(url)
        try:
            declare(box, None, partition=True)
            load(box, "held", waiting, lambda n: {"n": n, "tenant": f"p{n % partitions}"})
            analyse(url)
            hold_slots(url)
            consumer = box.consumer()
            times = []
            try:
                for _ in range(leases):
                    started = time.perf_counter()
                    assert consumer.transport.fetch(10) == []
                    times.append(time.perf_counter() - started)
            finally:
                consumer.session.close()
            return statistics.median(times)
        finally:
            box.close()


def per_job(server: str, measure: int) -> dict[str, float]:
    figures = {}
    for name, limits in (
        ("unlimited", None),
        ("concurrency", [Concurrency(1000)]),
        ("rate", [Rate("1000000/s")]),
    ):
        with postgres_url(server)() as url:
            box = Box(url)
            try:
                declare(box, limits)
                load(box, "work", measure, lambda n: {"n": n})
                analyse(url)
                figures[name] = throughput(box, measure)
            finally:
                box.close()
    figures["concurrency_ratio"] = figures["concurrency"] / figures["unlimited"]
    figures["rate_ratio"] = figures["rate"] / figures["unlimited"]
    return figures


def peer(server: str, measure: int) -> dict[str, float]:
    free = run_peer("pgqueuer", "pgqueuer_noop.py", server, ["--jobs", str(measure)], 3600)
    limited = run_peer(
        "pgqueuer",
        "pgqueuer_noop.py",
        server,
        ["--jobs", str(measure), "--concurrency-limit", "1000"],
        3600,
    )
    return {
        "unlimited": free["process_per_s"],
        "concurrency": limited["process_per_s"],
        "concurrency_ratio": limited["process_per_s"] / free["process_per_s"],
    }


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, nargs="+", default=[10, 1000, 10_000])
    parser.add_argument("--measure", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--peers", nargs="*", default=None, help="pgqueuer (needs .venv-peers)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    peers = (
        args.peers if args.peers is not None else (["pgqueuer"] if PEERS_PYTHON.exists() else [])
    )
    rounds_beside, rounds_jobs, rounds_peer = [], [], []
    leases: dict[str, list[float]] = {str(p): [] for p in args.partitions}
    for _ in range(args.rounds):
        rounds_beside.append(beside(args.postgres, args.waiting, args.measure))
        for partitions in args.partitions:
            leases[str(partitions)].append(blocked_lease(args.postgres, args.waiting, partitions))
        rounds_jobs.append(per_job(args.postgres, args.measure))
        if "pgqueuer" in peers:
            rounds_peer.append(peer(args.postgres, args.measure))
    figures = {
        "waiting": args.waiting,
        "measure": args.measure,
        "rounds": args.rounds,
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "beside": median_of(rounds_beside),
        "blocked_lease_ms": {
            p: round(statistics.median(times) * 1000, 3) for p, times in leases.items()
        },
        "per_job": median_of(rounds_jobs),
        "pgqueuer": median_of(rounds_peer) if rounds_peer else None,
    }
    b, j = figures["beside"], figures["per_job"]
    print(
        f"beside a saturated backlog of {args.waiting}: {b['beside']:.0f} jobs/s against "
        f"{b['alone']:.0f} alone (ratio {b['ratio']:.2f})"
    )
    for p, ms in figures["blocked_lease_ms"].items():
        print(f"a blocked lease, {args.waiting} waiting in {p} partition(s): {ms:.2f} ms")
    print(
        f"per job: unlimited {j['unlimited']:.0f}/s, Concurrency(1000) {j['concurrency']:.0f}/s "
        f"({j['concurrency_ratio']:.2f}), Rate {j['rate']:.0f}/s ({j['rate_ratio']:.2f})"
    )
    if figures["pgqueuer"]:
        q = figures["pgqueuer"]
        print(
            f"pgqueuer: unlimited {q['unlimited']:.0f}/s, concurrency_limit=1000 "
            f"{q['concurrency']:.0f}/s ({q['concurrency_ratio']:.2f})"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
