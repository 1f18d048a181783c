"""oncebox against its peers: every workload of the benchmark issue, in one run, on one PostgreSQL.

    make peers-env      # once: the peers in .venv-peers, never in oncebox's environment
    .venv/bin/python bench/compare.py [--size full|small|tiny] [--workloads 1 2 3 4 5 6 7 8]
                                      [--repeat N] [--postgres URL] [--peers [NAME ...]]
                                      [--json bench/results/latest.json]

Workloads (numbered as in the issue; each on fresh databases, oncebox and the peers alternating
within a round, the figure the median of --repeat rounds where a workload repeats):
1. bulk enqueue of N jobs, each library's fastest documented API;
2. processing N no-op jobs with one worker process at its best documented setting (oncebox keyed
   — the whole guarantee path — and keyless; SQLite too, for its own target);
3. the full guarantee path, oncebox only: claim the key, write an outbox row, complete; dispatch
   to the null provider and record the receipt, both lanes concurrently in one worker process,
   timed from the worker's start to the last receipt; read against the fastest peer's no-op
   figure (workload 2) and the floor's full path (workload 8) of this same run;
4. pick-up latency (enqueue committed -> handler start) at a steady rate, a worker process of its
   own (bench/latency.py); oncebox also at a low rate, for its low-load target;
5. throughput over the first M jobs of a large backlog against a small one (bench/backlog.py);
6. one period's fan-out over C eligible customers (bench/fanout.py);
7. an idle worker's transactions per second, all lanes (bench/idle.py);
8. the reference floor: the same SQL, batched, from a minimal script (bench/floor.py).

Every target of the issue is then checked against the figures of this run and printed as met or
not, with the measured gap. Sizes: `full` is the issue's (100 000 jobs, a 1 000 000-job backlog and
fan-out; about 15 minutes on the 2-core development machine); `small` is a quick look; `tiny` is
what the test suite runs (oncebox only). Procrastinate processes a few hundred jobs a second, so
it gets a tenth of N (its rate does not depend on N). The peers run in their own interpreter
(.venv-peers) from bench/peers/; without it, oncebox alone is measured.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import backlog
import fanout
import floor
import idle
import latency
from core import postgres_url, run_once, sqlite_url
from outbox import full_path
from peerrun import PEERS_PYTHON, run_peer

import oncebox

PEERS = {
    # name: (script, arguments for its best documented single-worker setting, share of N)
    "pgqueuer": ("pgqueuer_noop.py", ["--batch", "100"], 1.0),
    "procrastinate": ("procrastinate_noop.py", ["--concurrency", "10"], 0.1),
}


# procrastinate takes about 1.5 h over a 1 000 000-job backlog (2 jobs/s); measured apart, in
# docs/benchmarks.md
BACKLOG_PEERS = {"pgqueuer"}


@dataclass(frozen=True)
class Size:
    jobs: int  # workloads 1, 2, 3 and 8
    repeat: int
    latency_s: float
    backlog_small: int
    backlog_large: int
    backlog_measure: int
    fanout: int
    idle_s: float


SIZES = {
    "full": Size(100_000, 3, 10.0, 10_000, 1_000_000, 10_000, 1_000_000, 30.0),
    "small": Size(20_000, 1, 5.0, 10_000, 100_000, 5_000, 100_000, 10.0),
    "tiny": Size(200, 1, 1.0, 200, 400, 100, 500, 1.0),
}


def peer_noop(name: str, server: str, jobs: int) -> dict[str, float]:
    script, extra, _share = PEERS[name]
    figures = run_peer(name, script, server, ["--jobs", str(jobs), *extra], timeout=3600)
    return {"enqueue": figures["enqueue_per_s"], "process": figures["process_per_s"]}


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        name: {k: statistics.median(r[k] for r in found) for k in found[0]}
        for name, found in runs.items()
    }


def throughput(server: str, size: Size, peers: list[str]) -> dict[str, dict[str, float]]:
    """Workloads 1 and 2."""
    runs: dict[str, list[dict[str, float]]] = {}
    for _round in range(size.repeat):
        for keyed in (True, False):
            label = "oncebox keyed" if keyed else "oncebox keyless"
            with postgres_url(server)() as url:
                runs.setdefault(label, []).append(run_once(url, size.jobs, keyed))
        with sqlite_url() as url:
            runs.setdefault("oncebox keyed (SQLite)", []).append(run_once(url, size.jobs, True))
        for peer in peers:
            jobs = max(100, round(size.jobs * PEERS[peer][2]))
            runs.setdefault(peer, []).append(peer_noop(peer, server, jobs))
    return medians(runs)


def full_guarantee_path(server: str, size: Size) -> dict[str, float]:
    """Workload 3 (and 8, alternating with it: the floor is read in the same conditions)."""
    ours: list[float] = []
    two_consumers: list[float] = []
    floors: list[dict[str, float]] = []
    for _round in range(size.repeat):
        with postgres_url(server)() as url:
            ours.append(full_path(url, size.jobs))
        with postgres_url(server)() as url:
            two_consumers.append(full_path(url, size.jobs, concurrency=2))
        floors.append(
            {
                **floor.run_noop(server, size.jobs),
                **floor.run_full(server, size.jobs),
                **floor.run_ours(server, size.jobs),
            }
        )
    return {
        "oncebox_full_per_s": statistics.median(ours),
        "oncebox_full_2_consumers_per_s": statistics.median(two_consumers),
        **{k: statistics.median(f[k] for f in floors) for k in floors[0]},
    }


def pick_up(server: str, size: Size, peers: list[str]) -> dict[str, dict[str, Any]]:
    """Workload 4."""
    rows = {
        "oncebox (PostgreSQL) 200/s": latency.measure_oncebox(
            postgres_url(server), size.latency_s, 200.0
        ),
        "oncebox (PostgreSQL) 20/s": latency.measure_oncebox(
            postgres_url(server), size.latency_s, 20.0
        ),
        "oncebox (SQLite) 200/s": latency.measure_oncebox(sqlite_url, size.latency_s, 200.0),
    }
    for peer in peers:
        rows[f"{peer} 200/s"] = latency.measure_peer(peer, server, size.latency_s, 200.0)
    return rows


def backlogs(server: str, size: Size, peers: list[str]) -> dict[str, dict[str, float]]:
    """Workload 5."""
    rows: dict[str, dict[str, float]] = {}
    measures: dict[str, Callable[[int], dict[str, Any]]] = {
        "oncebox": lambda b: backlog.measure_oncebox(server, b, size.backlog_measure),
        **{
            peer: (lambda b, p=peer: backlog.measure_peer(p, server, b, size.backlog_measure))
            for peer in peers
            if peer in BACKLOG_PEERS
        },
    }
    for name, measure in measures.items():
        small = measure(size.backlog_small)["process_per_s"]
        large = measure(size.backlog_large)["process_per_s"]
        rows[name] = {"small_per_s": small, "large_per_s": large, "ratio": large / small}
    return rows


@dataclass(frozen=True)
class Target:
    name: str
    measured: float | None
    goal: float
    unit: str
    higher_is_better: bool = True

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        if self.higher_is_better:
            return self.measured >= self.goal
        return self.measured <= self.goal

    def row(self) -> dict[str, Any]:
        return {
            "target": self.name,
            "measured": None if self.measured is None else round(self.measured, 2),
            "goal": self.goal,
            "unit": self.unit,
            "met": self.met,
        }


def targets(figures: dict[str, Any]) -> list[Target]:
    """The issue's targets, read from this run's figures (None where not measured)."""
    tp = figures.get("throughput", {})
    peers = [v["process"] for k, v in tp.items() if not k.startswith("oncebox")]
    fastest = max(peers) if peers else None
    ours = tp.get("oncebox keyed", {}).get("process")
    full = figures.get("full_path", {})
    lat = figures.get("latency", {})
    bl = figures.get("backlog", {}).get("oncebox", {})

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    return [
        Target("no-op processing, PostgreSQL ÷ fastest peer", ratio(ours, fastest), 2.0, "x"),
        Target(
            "full guarantee path ÷ fastest peer's no-op",
            ratio(full.get("oncebox_full_per_s"), fastest),
            1.0,
            "x",
        ),
        Target(
            "full guarantee path ÷ floor's full path",
            ratio(full.get("oncebox_full_per_s"), full.get("full_per_s")),
            0.8,
            "x",
        ),
        Target(
            "bulk enqueue ÷ raw COPY",
            ratio(tp.get("oncebox keyed", {}).get("enqueue"), full.get("copy_per_s")),
            0.5,
            "x",
        ),
        Target(
            f"fan-out of {figures.get('fanout', {}).get('customers', 0):,} customers",
            figures.get("fanout", {}).get("seconds"),
            30.0,
            "s",
            higher_is_better=False,
        ),
        Target("large backlog ÷ small backlog", bl.get("ratio"), 0.8, "x"),
        Target(
            "SQLite no-op processing",
            tp.get("oncebox keyed (SQLite)", {}).get("process"),
            20_000,
            "jobs/s",
        ),
        Target(
            "PostgreSQL p50 pick-up at low load (20/s)",
            lat.get("oncebox (PostgreSQL) 20/s", {}).get("p50_ms"),
            10.0,
            "ms",
            higher_is_better=False,
        ),
        Target(
            "SQLite p50 pick-up at 200/s (≤ the 50 ms file watch)",
            lat.get("oncebox (SQLite) 200/s", {}).get("p50_ms"),
            50.0,
            "ms",
            higher_is_better=False,
        ),
        Target(
            "idle worker, PostgreSQL",
            figures.get("idle", {}).get("per_s"),
            1.0,
            "transactions/s",
            higher_is_better=False,
        ),
        Target(
            "idle worker, SQLite",
            figures.get("idle_sqlite", {}).get("per_s"),
            2.0,
            "transactions/s",
            higher_is_better=False,
        ),
    ]


def versions() -> dict[str, str]:
    found = {"oncebox": oncebox.__version__, "python": platform.python_version()}
    if PEERS_PYTHON.exists():
        listing = subprocess.run(
            [str(PEERS_PYTHON), "-m", "pip", "list", "--format=json"],
            check=False,
            capture_output=True,
            text=True,
        )
        if listing.returncode == 0:
            for package in json.loads(listing.stdout):
                if package["name"].lower() in {"pgqueuer", "procrastinate", "asyncpg"}:
                    found[package["name"].lower()] = package["version"]
    return found


def server_version(server: str) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def report(figures: dict[str, Any], checked: list[Target]) -> None:
    if "throughput" in figures:
        print(f"\n1-2. bulk enqueue and no-op processing ({figures['size']['jobs']} jobs)")
        ours = figures["throughput"]["oncebox keyed"]
        for name, row in figures["throughput"].items():
            print(
                f"  {name:<24}{row['enqueue']:>12,.0f} enqueued/s{row['process']:>10,.0f} "
                f"processed/s   oncebox keyed ÷ it: {ours['process'] / row['process']:.2f}"
            )
    if "full_path" in figures:
        print("\n3 and 8. the full guarantee path, and the reference floor (jobs/s)")
        for name, value in figures["full_path"].items():
            print(f"  {name:<32}{value:>12,.0f}")
    if "latency" in figures:
        print("\n4. pick-up latency (ms)")
        for name, row in figures["latency"].items():
            print(
                f"  {name:<28} p50 {row['p50_ms']:>8}  p99 {row['p99_ms']:>8}  "
                f"(rate reached {row.get('rate', '?')}/s)"
            )
    if "backlog" in figures:
        print("\n5. backlog: jobs/s over the first jobs of a small and a large backlog")
        for name, row in figures["backlog"].items():
            print(
                f"  {name:<16}{row['small_per_s']:>10,.0f}{row['large_per_s']:>10,.0f}"
                f"   large ÷ small {row['ratio']:.2f}"
            )
    if "fanout" in figures:
        row = figures["fanout"]
        print(f"\n6. fan-out: {row['customers']:,} customers in {row['seconds']} s")
    if "idle" in figures:
        print(
            f"\n7. idle worker: {figures['idle']['per_s']:.2f} transactions/s on PostgreSQL, "
            f"{figures['idle_sqlite']['per_s']:.2f}/s on SQLite"
        )
    print("\ntargets")
    for target in checked:
        verdict = {True: "met", False: "NOT MET", None: "not measured"}[target.met]
        shown = "-" if target.measured is None else f"{target.measured:,.2f}"
        sign = ">=" if target.higher_is_better else "<="
        print(f"  {target.name:<46}{shown:>12} {target.unit:<15}{sign} {target.goal:<9g}{verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--workloads", type=int, nargs="*", default=list(range(1, 9)))
    parser.add_argument("--repeat", type=int, help="default: the size's")
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--peers", nargs="*", default=sorted(PEERS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.workloads) - set(range(1, 9)))
    if unknown:
        parser.error(f"no workload {unknown}: they are numbered 1 to 8")
    size = SIZES[args.size]
    if args.repeat is not None:
        if args.repeat < 1:
            parser.error("--repeat must be at least 1")
        size = Size(**{**size.__dict__, "repeat": args.repeat})
    peers = [p for p in args.peers if PEERS_PYTHON.exists()]
    chosen = set(args.workloads)
    figures: dict[str, Any] = {
        "size": {"name": args.size, **size.__dict__},
        "machine": f"{platform.node()} {platform.machine()}, {platform.system()}",
        "postgres": server_version(args.postgres),
        "versions": versions(),
        "peers": peers,
    }
    if chosen & {1, 2}:
        figures["throughput"] = throughput(args.postgres, size, peers)
    if chosen & {3, 8}:
        figures["full_path"] = full_guarantee_path(args.postgres, size)
    if 4 in chosen:
        figures["latency"] = pick_up(args.postgres, size, peers)
    if 5 in chosen:
        figures["backlog"] = backlogs(args.postgres, size, peers)
    if 6 in chosen:
        figures["fanout"] = fanout.measure("postgres", size.fanout, args.postgres)
    if 7 in chosen:
        figures["idle"] = idle.measure(args.postgres, size.idle_s, warmup=5.0)
        figures["idle_sqlite"] = idle.measure_sqlite(size.idle_s, warmup=5.0)
    checked = targets(figures)
    figures["targets"] = [t.row() for t in checked]
    found = figures["versions"]
    shown = ", ".join(f"{p} {found.get(p, '?')}" for p in peers) or "none"
    print(
        f"oncebox {found['oncebox']} · PostgreSQL {figures['postgres']} · "
        f"Python {found['python']} · {figures['machine']} · size {args.size} · peers: {shown}"
    )
    report(figures, checked)
    if not PEERS_PYTHON.exists():
        print("peers not installed: run `make peers-env` to compare")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
