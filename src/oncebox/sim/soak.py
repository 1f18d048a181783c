"""Worlds one after another until stopped (`make sim-soak`, `oncebox sim --soak`): the suite's
budget is fixed, and a soak is how the rest of the seed space gets explored — overnight, on a
spare machine, after a change to a lane.

The sizes vary by seed (mostly shallow worlds, some deep: `SIZES`), a failure does not stop the
soak (its case is saved beside the others, to replay or shrink later), and what was found is
written to `summary.json` in the same folder when the soak stops — at the end of a seed range,
or at SIGINT/SIGTERM once the world under way has finished.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from oncebox.kernel import clock
from oncebox.kernel.inert import redact
from oncebox.sim.runner import run
from oncebox.sim.shrink import Case

SIZES = (25, 25, 25, 60, 150, 400)  # steps with faults, by seed: mostly shallow, some deep
PROGRESS_EVERY = 60.0  # seconds between two progress lines


def steps_for(seed: int) -> int:
    """A seed's world size in a soak: the same in every soak, so a seed names one world."""
    return SIZES[seed % len(SIZES)]


@dataclass
class Found:
    seed: int
    steps: int
    invariant: str
    detail: str
    at: int | None
    case: str


@dataclass
class SoakSummary:
    store: str
    mutation: str | None
    first_seed: int
    last_seed: int | None = None
    worlds: int = 0
    steps: int = 0
    seconds: float = 0.0
    failures: list[Found] = field(default_factory=list)

    def line(self) -> str:
        rate = self.worlds / self.seconds if self.seconds else 0.0
        seeds = f"seeds {self.first_seed}..{self.last_seed}" if self.worlds else "no world yet"
        return (
            f"{self.worlds} worlds ({seeds}), {len(self.failures)} failed, "
            f"{self.seconds:.0f} s, {rate:.1f} worlds/s"
        )


def soak(
    store: str,
    seeds: range | None,
    found: Path,
    stop: threading.Event,
    *,
    start: int = 0,
    mutation: str | None = None,
    say: Callable[[str], None] = print,
) -> SoakSummary:
    """Run worlds from `start` (or through `seeds`) until `stop` is set; save each failure's
    case in `found` and, at the end, `found/summary.json`."""
    found.mkdir(parents=True, exist_ok=True)
    first = seeds.start if seeds is not None else start
    shown = "sqlite" if store == "sqlite" else redact(store)
    summary = SoakSummary(store=shown, mutation=mutation, first_seed=first)
    began = clock.monotonic()
    said = began
    seed = first
    while not stop.is_set() and (seeds is None or seed in seeds):
        steps = steps_for(seed)
        outcome = run(store, seed=seed, steps=steps, mutation=mutation)
        summary.worlds += 1
        summary.steps += len(outcome.steps)
        summary.last_seed = seed
        if outcome.failed and outcome.violation is not None:
            path = found / f"seed-{seed}.json"
            Case(store, steps, list(outcome.record), mutation).save(path)
            summary.failures.append(
                Found(
                    seed,
                    steps,
                    outcome.violation.invariant,
                    outcome.violation.detail,
                    outcome.at,
                    str(path),
                )
            )
            say(f"seed {seed} ({steps} steps) FAILED after step {outcome.at}: {outcome.violation}")
            say(f"  saved {path}: oncebox sim --replay {path} [--shrink]")
        now = clock.monotonic()
        summary.seconds = now - began
        if now - said >= PROGRESS_EVERY:
            said = now
            say(summary.line())
        seed += 1
    summary.seconds = clock.monotonic() - began
    (found / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n", "utf-8")
    return summary
