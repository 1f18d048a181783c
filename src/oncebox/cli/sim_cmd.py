"""`oncebox sim`: the deterministic simulation (see oncebox.sim and docs/simulation.md)."""

from __future__ import annotations

import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from oncebox.cli.common import reported, say
from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.inert import redact

SEEDS = re.compile(r"(\d+)\.\.(\d+)")


def _seed_range(_ctx: click.Context, _param: click.Parameter, text: str | None) -> range | None:
    if text is None:
        return None
    found = SEEDS.fullmatch(text)
    if found is None or int(found[1]) > int(found[2]):
        raise click.BadParameter(f"{text!r} is not a range A..B (A <= B)")
    return range(int(found[1]), int(found[2]) + 1)


@click.command()
@click.option("--seed", type=click.IntRange(0), help="One world, from this seed.  [default: 0]")
@click.option(
    "--seeds",
    "seed_range",
    metavar="A..B",
    callback=_seed_range,
    help="Every seed from A to B, inclusive.",
)
@click.option(
    "--steps",
    type=click.IntRange(1, 100_000),
    default=150,
    show_default=True,
    help="Steps with faults before the quiet phase (the drain to an end state).",
)
@click.option(
    "--store",
    default="sqlite",
    show_default=True,
    metavar="sqlite|postgresql://…",
    help="A new SQLite file per world, or a schema of its own per world on that server.",
)
@click.option("--mutation", metavar="NAME", help="A fence removed on purpose (chaos mutations).")
@click.option("--shrink", is_flag=True, help="Make a failure small before reporting it.")
@click.option(
    "--tries",
    type=click.IntRange(1, 100_000),
    default=300,
    show_default=True,
    help="How many runs --shrink may spend.",
)
@click.option(
    "--replay",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Run the case a failure saved (its choices, steps, store and mutation) again.",
)
@click.option(
    "--save",
    "save_to",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("oncebox-sim-failure.json"),
    show_default=True,
    help="Where a failure's case is written, for --replay.",
)
@click.option(
    "--soak",
    is_flag=True,
    help="Run worlds of varied sizes until stopped (Ctrl-C), or through --seeds; a failure "
    "is saved and the soak goes on.",
)
@click.option(
    "--found",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sim-soak"),
    show_default=True,
    help="Where --soak saves each failure's case and, when it stops, summary.json.",
)
def sim(**options: Any) -> None:
    """Run worlds of real actors, stepped one store call at a time by a seed, checking every
    invariant after every step. Exit 1 on the first failure, with its trace and how to replay
    it; 0 when every world held. With --soak: exit 1 if any world failed."""
    with reported():
        code = _sim(**options)
    sys.exit(code)


def _sim(
    *,
    seed: int | None,
    seed_range: range | None,
    steps: int,
    store: str,
    mutation: str | None,
    shrink: bool,
    tries: int,
    replay: Path | None,
    save_to: Path,
    soak: bool,
    found: Path,
) -> int:
    from oncebox.chaos.mutations import check  # noqa: PLC0415 (the harness loads on use)
    from oncebox.sim.runner import run  # noqa: PLC0415
    from oncebox.sim.shrink import Case  # noqa: PLC0415
    from oncebox.sim.shrink import shrink as shrunk  # noqa: PLC0415

    if store != "sqlite" and not store.startswith(("postgresql://", "postgres://")):
        raise ConfigurationError(f"--store {redact(store)!r}: use sqlite or postgresql://…")
    if mutation is not None:
        check((mutation,))
    if soak:
        if replay is not None or shrink:
            raise ConfigurationError(
                "--soak runs seeds and saves failures: not with --replay or --shrink"
            )
        return _soak(store, seed, seed_range, mutation, found)

    if replay is not None:
        case = Case.load(replay)
        outcome = _run_case(case)
        if shrink and outcome.failed:
            say(f"the case failed ({outcome.violation}); shrinking…")
            case, outcome = shrunk(case, outcome, _run_case, tries)
        return _report(outcome, case, f"--replay {replay}", save_to, shrunk_=shrink)
    seeds = seed_range or range(seed or 0, (seed or 0) + 1)
    where = "sqlite" if store == "sqlite" else redact(store)
    say(
        f"oncebox sim · {where} · seeds {seeds.start}..{seeds.stop - 1} · {steps} steps"
        + (f" · mutation {mutation}" if mutation else "")
    )
    for number in seeds:
        outcome = run(store, seed=number, steps=steps, mutation=mutation)
        if outcome.failed:
            case = Case(store, steps, list(outcome.record), mutation)
            again = f"--seed {number} --steps {steps} --store {where}" + (
                f" --mutation {mutation}" if mutation else ""
            )
            if shrink:
                say(f"seed {number} failed ({outcome.violation}); shrinking…")
                case, outcome = shrunk(case, outcome, _run_case, tries)
            return _report(outcome, case, again, save_to, shrunk_=shrink)
    say(f"{len(seeds)} worlds, every invariant held")
    return 0


def _run_case(case: Any) -> Any:
    """A saved case run again: its store, its choices, its steps, its mutation."""
    from oncebox.sim.runner import run  # noqa: PLC0415

    return run(case.store, record=case.record, steps=case.steps, mutation=case.mutation)


def _soak(
    store: str, seed: int | None, seeds: range | None, mutation: str | None, found: Path
) -> int:
    """Worlds until SIGINT or SIGTERM (the one under way finishes first), or through `seeds`."""
    from oncebox.sim.soak import soak  # noqa: PLC0415

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    where = "sqlite" if store == "sqlite" else redact(store)
    bound = (
        f"seeds {seeds.start}..{seeds.stop - 1}"
        if seeds
        else f"from seed {seed or 0}, until stopped"
    )
    say(f"oncebox sim --soak · {where} · {bound}" + (f" · mutation {mutation}" if mutation else ""))
    summary = soak(store, seeds, found, stop, start=seed or 0, mutation=mutation, say=say)
    say(f"soak stopped: {summary.line()}; {found / 'summary.json'}")
    return 1 if summary.failures else 0


def _report(outcome: object, case: object, again: str, save_to: Path, shrunk_: bool = False) -> int:
    from oncebox.sim.runner import Outcome  # noqa: PLC0415
    from oncebox.sim.shrink import Case  # noqa: PLC0415

    assert isinstance(outcome, Outcome) and isinstance(case, Case)
    if not outcome.failed:
        say(f"held: every invariant, {len(outcome.steps)} steps")
        return 0
    steps_to = (outcome.at or 0) + 1
    say(f"FAILED after step {outcome.at}: {outcome.violation}")
    say(outcome.trace())
    case.save(save_to)
    if shrunk_:
        say(f"shrunk to {steps_to} steps, {len(case.record)} choices; saved to {save_to}")
        say(f"replay: oncebox sim --replay {save_to}")
    else:
        say(f"replay: oncebox sim {again}  (or --replay {save_to})")
    return 1
