"""The full chaos run: every scenario and the soak, on both stores, over several seeds.

    .venv/bin/python bench/chaos.py [--customers 200] [--seeds 1 2 3] [--postgres URL]
                                    [--allow-server-restart] [--json bench/results/chaos.json]

CI runs only the `ci` set (tests/test_chaos.py) at a few dozen customers; this runs `all` plus the
soak, per seed, and writes one row per (store, seed, scenario) — what docs/guarantees.md's table
of the latest full run is made from. Exit 1 if any scenario was violated.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_POSTGRES = "postgresql://127.0.0.1:5432/test"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--customers", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="'' to skip PostgreSQL")
    parser.add_argument("--scenario", default="all", help="all (default), ci, or one name")
    parser.add_argument("--no-soak", action="store_true")
    parser.add_argument("--allow-server-restart", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from oncebox.chaos import run_selected

    rows: list[dict[str, Any]] = []
    failed = 0
    servers: list[str | None] = [None] + ([args.postgres] if args.postgres else [])
    for server in servers:
        for seed in args.seeds:
            quiet = io.StringIO()
            results = run_selected(
                args.scenario,
                server=server,
                customers=args.customers,
                seed=seed,
                soak=not args.no_soak,
                allow_server_restart=args.allow_server_restart,
                out=quiet,
            )
            for result in results:
                failed += not result.ok
                rows.append(
                    {
                        "store": result.store,
                        "seed": seed,
                        "scenario": result.scenario,
                        "ok": result.ok,
                        "seconds": result.seconds,
                        **asdict(result.tally),
                        "faults": len(result.faults),
                        "settled_s": result.settled_s,
                        "bound_s": result.bound_s,
                        "violations": [asdict(v) for v in result.violations],
                    }
                )
                verdict = "ok" if result.ok else "VIOLATED"
                print(
                    f"{result.store:<8} seed {seed:<3} {result.scenario:<62} "
                    f"{result.tally.delivered:>6}/{result.tally.eligible:<6} "
                    f"dups {result.tally.actual_duplicates}/{result.tally.possible_duplicates} "
                    f"lost {result.tally.lost} {result.seconds:>6} s {verdict}",
                    flush=True,
                )
                if not result.ok:
                    print(quiet.getvalue(), file=sys.stderr)
    print(f"\n{len(rows) - failed} of {len(rows)} runs held")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": f"{platform.node()} · {platform.machine()} · "
                    f"Python {platform.python_version()}",
                    "customers": args.customers,
                    "seeds": args.seeds,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
