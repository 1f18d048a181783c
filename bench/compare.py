"""oncebox against its peers, side by side in one run on the same PostgreSQL: workloads 1 (bulk
enqueue) and 2 (processing no-op jobs with one worker process at its best documented setting).

    make peers-env      # once: the peers in .venv-peers, never in oncebox's environment
    .venv/bin/python bench/compare.py [--jobs 100000] [--repeat 3] [--postgres URL]
                                      [--json bench/results/latest.json]

Each round runs oncebox (keyed: the whole guarantee path; keyless: plain at-least-once), then
every peer, alternating, each on a fresh database; the figure is the median of `--repeat`
rounds, and the ratio is oncebox (keyed) / peer. The peers run in their own interpreter
(.venv-peers) from bench/peers/*_noop.py. Without .venv-peers, oncebox alone is measured and the
peers are listed as not installed. The remaining workloads of the benchmark issue (latency, big
backlogs, the full path against the peers, idle query rate, the reference floor) are not here yet.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import postgres_url, run_once

ROOT = Path(__file__).resolve().parents[1]
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
PEERS = {
    # name: (script, arguments for its best documented single-worker setting)
    "pgqueuer": ("pgqueuer_noop.py", ["--batch", "100"]),
    "procrastinate": ("procrastinate_noop.py", ["--concurrency", "10"]),
}


def peer_once(name: str, server: str, jobs: int) -> dict[str, float]:
    script, extra = PEERS[name]
    command = [str(PEERS_PYTHON), str(ROOT / "bench" / "peers" / script), "--server", server]
    result = subprocess.run(
        [*command, "--jobs", str(jobs), *extra],
        check=False,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        raise SystemExit(f"{name} failed: {result.stderr.strip().splitlines()[-1:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    return {"enqueue": figures["enqueue_per_s"], "process": figures["process_per_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--peer-jobs", type=int, default=None, help="default: --jobs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--peers", nargs="*", default=sorted(PEERS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    installed = PEERS_PYTHON.exists()
    peers = [p for p in args.peers if installed]
    peer_jobs = args.peer_jobs or args.jobs
    runs: dict[str, list[dict[str, float]]] = {}
    make = postgres_url(args.postgres)
    for _round in range(args.repeat):
        for keyed in (True, False):
            with make() as url:
                label = "oncebox keyed" if keyed else "oncebox keyless"
                runs.setdefault(label, []).append(run_once(url, args.jobs, keyed))
        for peer in peers:
            runs.setdefault(peer, []).append(peer_once(peer, args.postgres, peer_jobs))
    medians = {
        name: {k: statistics.median(r[k] for r in found) for k in found[0]}
        for name, found in runs.items()
    }
    ours = medians["oncebox keyed"]
    rows: list[dict[str, Any]] = []
    for name, figures in medians.items():
        rows.append(
            {
                "library": name,
                "enqueue_per_s": round(figures["enqueue"]),
                "process_per_s": round(figures["process"]),
                "process_ratio": round(ours["process"] / figures["process"], 2),
                "enqueue_ratio": round(ours["enqueue"] / figures["enqueue"], 2),
            }
        )
    print(
        f"PostgreSQL · {args.jobs} jobs (peers {peer_jobs}) · median of {args.repeat} · "
        f"Python {platform.python_version()} · {platform.machine()}"
    )
    print(
        f"{'library':<17}{'bulk enqueue/s':>15}{'no-op process/s':>17}"
        f"{'oncebox keyed ÷ it (process)':>31}"
    )
    for row in rows:
        print(
            f"{row['library']:<17}{row['enqueue_per_s']:>15,}{row['process_per_s']:>17,}"
            f"{row['process_ratio']:>31}"
        )
    if not installed:
        print("peers not installed: run `make peers-env` to compare")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "jobs": args.jobs,
                    "peer_jobs": peer_jobs,
                    "repeat": args.repeat,
                    "machine": f"{platform.node()} {platform.machine()}",
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
