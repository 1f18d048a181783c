"""oncebox against its peers: every workload of the benchmark issue, in one run, on one PostgreSQL.

    make peers-env      # once: the peers in .venv-peers, never in oncebox's environment
    .venv/bin/python bench/compare.py [--size full|small|tiny] [--workloads 1 2 3 4 5 6 7 8]
                                      [--repeat N] [--postgres URL] [--peers [NAME ...]]
                                      [--json bench/results/latest.json]

Workloads (numbered as in the issue; each on fresh databases). Workloads 1, 2, 3 and 8 run in
rounds: each round runs every system and workload once, so a ratio of two figures is taken
within a round, and the ratio reported is the median of the rounds' ratios:
1. bulk enqueue of N jobs, each library's fastest documented API;
2. processing N no-op jobs with one worker process at its best documented setting (oncebox keyed
   — the whole guarantee path — and keyless; SQLite too, for its own target; keyed through
   RabbitMQ, jobs recorded, when a broker answers at --amqp: enqueue is the relayed insert with
   its publish row, process the relay's publishing plus one lane's draining), pgqueuer on
   uvloop as its own CLI runs it. Every system gets the statistics a production server would
   have by then: an ANALYZE after the load, as autovacuum would (the benchmark server runs with
   autovacuum off). oncebox keyed and pgqueuer run once more without it, as a robustness row:
   oncebox's lease forces its index order, pgqueuer's dequeue plan degrades on stale statistics;
3. the full guarantee path, oncebox only: claim the key, write an outbox row, complete; dispatch
   to the null provider and record the receipt, both lanes concurrently in one worker process,
   timed from the worker's start to the last receipt; read against pgqueuer's no-op figure
   (workload 2) and the floor's full path (workload 8) of the same round;
4. pick-up latency (enqueue committed -> handler start) at 200/s and 20/s, each system in a
   worker process of its own (bench/latency.py);
5. throughput over the first M jobs of a large backlog against a small one (bench/backlog.py);
6. one period's fan-out over C eligible customers (bench/fanout.py);
7. an idle worker's statements per second, all lanes, as the server counts them (bench/idle.py);
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
import brokers
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
# the peers also measured on stale statistics, beside oncebox: the robustness rows
STALE_PEERS = {"pgqueuer"}


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


def peer_noop(name: str, server: str, jobs: int, stats: str = "fresh") -> dict[str, float]:
    script, extra, _share = PEERS[name]
    figures = run_peer(
        name, script, server, ["--jobs", str(jobs), *extra, "--stats", stats], timeout=3600
    )
    return {"enqueue": figures["enqueue_per_s"], "process": figures["process_per_s"]}


RABBIT = "oncebox keyed via RabbitMQ"  # recorded: relayed, published, drained by one lane


def throughput(
    server: str, size: Size, peers: list[str], amqp: str | None = None
) -> dict[str, Any]:
    """Workloads 1, 2, 3 and 8, in rounds: each round runs every system and workload once, one
    after the other on fresh databases, so a ratio of two figures is taken within a round —
    the same machine load, the same server state — and the reported ratio is the median of the
    rounds' ratios. Every system gets the statistics a production server would have by the
    time its worker drains the load (an ANALYZE after it, as autovacuum would: the benchmark
    server runs without autovacuum); the stale rows, oncebox keyed and pgqueuer without it,
    are a robustness check, not a target."""
    runs: dict[str, list[dict[str, float]]] = {}
    full: dict[str, list[float]] = {}
    floors: list[dict[str, float]] = []
    for _round in range(size.repeat):
        for keyed in (True, False):
            label = "oncebox keyed" if keyed else "oncebox keyless"
            with postgres_url(server)() as url:
                runs.setdefault(label, []).append(run_once(url, size.jobs, keyed))
        with postgres_url(server)() as url:
            runs.setdefault("oncebox keyed, stale statistics", []).append(
                run_once(url, size.jobs, True, stats="stale")
            )
        with sqlite_url() as url:
            runs.setdefault("oncebox keyed (SQLite)", []).append(run_once(url, size.jobs, True))
        for peer in peers:
            jobs = max(100, round(size.jobs * PEERS[peer][2]))
            runs.setdefault(peer, []).append(peer_noop(peer, server, jobs))
            if peer in STALE_PEERS:
                runs.setdefault(f"{peer}, stale statistics", []).append(
                    peer_noop(peer, server, jobs, stats="stale")
                )
        if amqp is not None:  # enqueue: relayed (with each publish); process: relay + lane
            through = brokers.relayed(server, amqp, size.jobs)
            runs.setdefault(RABBIT, []).append(
                {"enqueue": through["relayed_enqueue"], "process": through["relayed"]}
            )
        with postgres_url(server)() as url:
            full.setdefault("oncebox_full_per_s", []).append(full_path(url, size.jobs))
        with postgres_url(server)() as url:
            full.setdefault("oncebox_full_2_consumers_per_s", []).append(
                full_path(url, size.jobs, concurrency=2)
            )
        floors.append(
            {
                **floor.run_noop(server, size.jobs),
                **floor.run_full(server, size.jobs),
                **floor.run_ours(server, size.jobs),
            }
        )
    rounds = range(size.repeat)

    def per_round(top: Callable[[int], float], bottom: Callable[[int], float]) -> float:
        return statistics.median(top(r) / bottom(r) for r in rounds)

    ratios: dict[str, float] = {}
    keyed = runs["oncebox keyed"]
    ours_full = full["oncebox_full_per_s"]
    ratios["bulk enqueue ÷ COPY"] = per_round(
        lambda r: keyed[r]["enqueue"], lambda r: floors[r]["copy_per_s"]
    )
    ratios["full path ÷ floor's full path"] = per_round(
        lambda r: ours_full[r], lambda r: floors[r]["full_per_s"]
    )
    for peer in peers:
        theirs = runs[peer]
        ratios[f"no-op keyed ÷ {peer}"] = per_round(
            lambda r, t=theirs: keyed[r]["process"], lambda r, t=theirs: t[r]["process"]
        )
        ratios[f"full path ÷ {peer}'s no-op"] = per_round(
            lambda r, t=theirs: ours_full[r], lambda r, t=theirs: t[r]["process"]
        )
    if amqp is not None:
        theirs = runs[RABBIT]
        ratios["no-op keyed via RabbitMQ ÷ table"] = per_round(
            lambda r: theirs[r]["process"], lambda r: keyed[r]["process"]
        )
    return {
        "systems": medians(runs),
        "full_path": {
            **{k: statistics.median(v) for k, v in full.items()},
            **{k: statistics.median(f[k] for f in floors) for k in floors[0]},
        },
        "ratios": ratios,
    }


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {
        name: {k: statistics.median(r[k] for r in found) for k in found[0]}
        for name, found in runs.items()
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
        for rate in (200.0, 20.0):
            rows[f"{peer} {rate:.0f}/s"] = latency.measure_peer(peer, server, size.latency_s, rate)
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
    """The speed issue's targets, read from this run's figures (None where not measured). A
    ratio of two workloads is the median of the ratios taken within each round."""
    tp = figures.get("throughput", {})
    ratios = tp.get("ratios", {})
    systems = tp.get("systems", {})
    lat = figures.get("latency", {})
    bl = figures.get("backlog", {}).get("oncebox", {})
    peer = "pgqueuer"

    def latency_ratio(rate: str, quantile: str) -> float | None:
        ours = lat.get(f"oncebox (PostgreSQL) {rate}", {}).get(quantile)
        theirs = lat.get(f"{peer} {rate}", {}).get(quantile)
        return None if ours is None or not theirs else ours / theirs

    checked = [
        Target(f"no-op processing ÷ {peer}'s", ratios.get(f"no-op keyed ÷ {peer}"), 1.5, "x"),
        Target(
            f"full guarantee path ÷ {peer}'s no-op",
            ratios.get(f"full path ÷ {peer}'s no-op"),
            1.0,
            "x",
        ),
        Target(
            "full guarantee path ÷ floor's", ratios.get("full path ÷ floor's full path"), 0.4, "x"
        ),
        Target("bulk enqueue ÷ raw COPY", ratios.get("bulk enqueue ÷ COPY"), 0.4, "x"),
    ]
    for rate in ("200/s", "20/s"):
        for quantile in ("p50_ms", "p99_ms"):
            checked.append(
                Target(
                    f"pick-up {quantile[:3]} at {rate} ÷ {peer}'s",
                    latency_ratio(rate, quantile),
                    1.0,
                    "x",
                    higher_is_better=False,
                )
            )
    checked += [
        Target(
            f"fan-out of {figures.get('fanout', {}).get('customers', 0):,} customers",
            figures.get("fanout", {}).get("seconds"),
            15.0,
            "s",
            higher_is_better=False,
        ),
        Target("large backlog ÷ small backlog", bl.get("ratio"), 0.8, "x"),
        Target(
            "idle worker, PostgreSQL, statements the server ran",
            figures.get("idle", {}).get("per_s"),
            1.0,
            "per second",
            higher_is_better=False,
        ),
        Target(
            "SQLite no-op processing",
            systems.get("oncebox keyed (SQLite)", {}).get("process"),
            20_000,
            "jobs/s",
        ),
        Target(
            "SQLite p50 pick-up at 200/s (≤ the 50 ms file watch)",
            lat.get("oncebox (SQLite) 200/s", {}).get("p50_ms"),
            50.0,
            "ms",
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
    return checked


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
        tp = figures["throughput"]
        print(f"\n1-2. bulk enqueue and no-op processing ({figures['size']['jobs']} jobs)")
        for name, row in tp["systems"].items():
            print(
                f"  {name:<34}{row['enqueue']:>12,.0f} enqueued/s{row['process']:>10,.0f} "
                "processed/s"
            )
        print("\n3 and 8. the full guarantee path, and the reference floor (jobs/s)")
        for name, value in tp["full_path"].items():
            print(f"  {name:<34}{value:>12,.0f}")
        print("\nratios, each the median of the rounds' own")
        for name, value in tp["ratios"].items():
            print(f"  {name:<34}{value:>12.2f}")
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
            f"\n7. idle worker: {figures['idle']['per_s']:.2f} statements/s on PostgreSQL "
            f"(counted by {figures['idle'].get('counted_by', 'the server')}), "
            f"{figures['idle_sqlite']['per_s']:.2f} transactions/s on SQLite"
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
    parser.add_argument(
        "--amqp",
        default="amqp://guest:guest@127.0.0.1:5672/%2F",
        help="RabbitMQ for the broker-held row (skipped, saying so, when none answers)",
    )
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
    amqp = args.amqp if brokers.reachable(args.amqp) else None
    if amqp is None:
        print(f"no RabbitMQ answers at {args.amqp}: the broker-held row is not measured")
    if chosen & {1, 2, 3, 8}:
        figures["throughput"] = throughput(args.postgres, size, peers, amqp)
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
