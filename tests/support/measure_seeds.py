"""The first failing seed of every mutation and breakage `tests/test_sim.py` pins, measured again.

A world is a function of its seed, so a change to the worlds (a new part, actor or choice) moves
the seeds at which a removed fence is first caught. This scans each pinned mutation's and
breakage's seeds from 0, as docs/simulation.md says they were measured, stops at its first
failure, and prints it beside the pinned one — with the lines to paste into `CAUGHT`,
`BREAKAGES` and `PG_CAUGHT` when they moved:

    .venv/bin/python tests/support/measure_seeds.py                 # SQLite, 150 steps
    .venv/bin/python tests/support/measure_seeds.py --store pg      # PostgreSQL, 60 steps
    .venv/bin/python tests/support/measure_seeds.py --jobs 2 unlimit-any-task no-resume

Names narrow the scan to those mutations or breakages; any mutation may be named, pinned or
not (an unseen one, to see whether the worlds catch it now). SQLite worlds run in a new file
each; `--store pg` runs on the suite's server (`ONCEBOX_TEST_POSTGRES`, as `tests/conftest.py`
reads it) or on the URL given. `--jobs N` scans N names at once, each in a process of its own
(a run is one world at a time in a process). Exit 1 when a pinned seed moved or a name was not
caught within `--upto` seeds; 0 when every pinned seed is where the tests say.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # run as a script: the suite's modules (conftest, test_sim)
    sys.path.insert(0, str(TESTS))

import pytest  # noqa: E402 (after the suite's folder is on the path)

import test_sim  # noqa: E402
from conftest import PG_URL  # noqa: E402
from oncebox.chaos.mutations import MUTATIONS  # noqa: E402
from oncebox.sim.runner import run  # noqa: E402


@dataclass(frozen=True)
class Target:
    """One thing to scan: a mutation (by name) or a breakage (`test_sim.BREAKAGES`)."""

    name: str
    breakage: bool
    pinned: int | None  # its first failing seed as the tests pin it (None: not pinned)
    invariants: tuple[str, ...]  # those the tests accept (empty: any)
    steps: int | None = None  # the steps it is pinned at (None: the store's default)


@dataclass(frozen=True)
class Found:
    target: Target
    seed: int | None  # the first failing seed (None: every seed held)
    invariant: str | None
    evidence: str
    seconds: float

    @property
    def moved(self) -> bool:
        return self.seed != self.target.pinned

    @property
    def unexpected(self) -> bool:
        """Failed by an invariant the tests do not accept for it."""
        accepted = self.target.invariants
        return self.invariant is not None and bool(accepted) and self.invariant not in accepted


def pinned(postgres: bool) -> list[Target]:
    """What tests/test_sim.py pins for one store, with the invariants it accepts."""
    if postgres:
        return [
            Target(n, False, seed, i, steps)
            for n, (steps, seed, i) in sorted(test_sim.PG_CAUGHT.items())
        ]
    mutations = [Target(n, False, s, i) for n, (s, i) in sorted(test_sim.CAUGHT.items())]
    breakages = [Target(n, True, s, (i,)) for n, (_b, i, s) in sorted(test_sim.BREAKAGES.items())]
    return mutations + breakages


def chosen(names: list[str], postgres: bool) -> list[Target]:
    """The pinned targets, or those named (a mutation pinned for no store scanned as well)."""
    everything = pinned(postgres)
    if not names:
        return everything
    by_name = {t.name: t for t in everything}
    targets = []
    for name in names:
        if name in by_name:
            targets.append(by_name[name])
        elif name in MUTATIONS:
            targets.append(Target(name, False, None, ()))
        elif name in test_sim.BREAKAGES:
            _breakage, invariant, seed = test_sim.BREAKAGES[name]
            targets.append(Target(name, True, seed, (invariant,)))
        else:
            raise SystemExit(f"measure_seeds: {name!r} is neither a mutation nor a breakage")
    return targets


def scan(job: tuple[Target, str, int, int]) -> Found:
    """Seeds 0, 1, … of `target` until one fails (or `upto` held)."""
    target, store, steps, upto = job
    steps = target.steps or steps
    began = time.perf_counter()
    mutation = None if target.breakage else target.name
    with pytest.MonkeyPatch.context() as patch:
        if target.breakage:
            breakage: Callable[[pytest.MonkeyPatch], None] = test_sim.BREAKAGES[target.name][0]
            breakage(patch)
        for seed in range(upto):
            outcome = run(store, seed=seed, steps=steps, mutation=mutation)
            if outcome.violation is not None:
                return Found(
                    target,
                    seed,
                    outcome.violation.invariant,
                    str(outcome.violation)[:300],
                    time.perf_counter() - began,
                )
    return Found(target, None, None, "", time.perf_counter() - began)


def line(found: Found) -> str:
    target = found.target
    was = "-" if target.pinned is None else str(target.pinned)
    now = "none" if found.seed is None else str(found.seed)
    mark = "moved" if found.moved else "same"
    if found.unexpected:
        mark += f", by {found.invariant} (the tests accept {', '.join(target.invariants)})"
    kind = "breakage" if target.breakage else "mutation"
    return (
        f"{target.name:<28} {kind:<8} pinned {was:>4}  measured {now:>4} "
        f"{found.invariant or '':<3} [{mark}] {found.seconds:6.1f}s"
    )


def pasted(found: Found, postgres: bool) -> str:
    """The line to paste into tests/test_sim.py for a moved seed."""
    target, seed = found.target, found.seed
    if target.breakage:
        return f'"{target.name}": ({target.name}, "{found.invariant}", {seed}),  # BREAKAGES'
    invariants = target.invariants or ((found.invariant,) if found.invariant else ())
    if postgres:
        steps = target.steps or test_sim.PG_MUTATION_STEPS
        return f'"{target.name}": ({steps}, {seed}, {invariants!r}),  # PG_CAUGHT'
    return f'"{target.name}": ({seed}, {invariants!r}),  # CAUGHT'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutations or breakages (default: every pinned)")
    parser.add_argument("--store", default="sqlite", help="sqlite (default), pg, or a URL")
    parser.add_argument("--jobs", type=int, default=1, help="names scanned at once")
    parser.add_argument("--upto", type=int, default=200, help="seeds scanned: 0..UPTO-1")
    parser.add_argument("--steps", type=int, help="steps with faults (the suite's by default)")
    args = parser.parse_args(argv)
    postgres = args.store != "sqlite"
    store = PG_URL if args.store == "pg" else args.store
    steps = args.steps or (test_sim.PG_MUTATION_STEPS if postgres else test_sim.STEPS)
    targets = chosen(args.names, postgres)
    if args.steps:  # said on the command line: for every target, whatever it is pinned at
        targets = [replace(target, steps=args.steps) for target in targets]
    # the longest scans first, so the processes finish together
    targets.sort(key=lambda t: -1 if t.pinned is None else t.pinned, reverse=True)
    jobs = [(target, store, steps, args.upto) for target in targets]
    print(f"measuring {len(jobs)} on {store} at {steps} steps, seeds 0..{args.upto - 1}")
    results: list[Found] = []
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            for found in pool.imap_unordered(scan, jobs):
                print(line(found), flush=True)
                results.append(found)
    else:
        for job in jobs:
            found = scan(job)
            print(line(found), flush=True)
            results.append(found)
    moved = [f for f in results if f.moved or f.unexpected]
    for found in sorted(moved, key=lambda f: f.target.name):
        print("  " + pasted(found, postgres))
        if found.evidence:
            print(f"    {found.evidence}")
    deep = test_sim.CHUNKS * test_sim.PER_CHUNK
    late = [f for f in results if not postgres and f.seed is not None and f.seed >= deep]
    for found in late:
        print(f"  {found.target.name}: seed {found.seed} is past the budget's deep worlds ({deep})")
    return 1 if moved or late else 0


if __name__ == "__main__":
    sys.exit(main())
