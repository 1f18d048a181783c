"""A failing run made small: fewer steps, fewer and simpler choices, the same invariant broken.

A run is a function of its record of choices (`Choices`), so shrinking edits the record, never
the code: it tries fewer steps, then deletes runs of choices (halves, quarters, … single ones),
then lowers each choice towards 0 (the first actor, no fault, the first key) — keeping each edit
that still breaks the same invariant no later in the trace, until none does or the budget of
tries is spent. What is left replays with `oncebox sim --replay FILE`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from oncebox.kernel.errors import ConfigurationError
from oncebox.sim.runner import Outcome


@dataclass(frozen=True)
class Case:
    """Everything a run needs to happen again: the file `--replay` reads."""

    store: str
    steps: int
    record: list[int]
    mutation: str | None = None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)) + "\n", "utf-8")

    @classmethod
    def load(cls, path: Path) -> Case:
        try:
            data = json.loads(path.read_text("utf-8"))
            record = [int(choice) for choice in data["record"]]
            mutation = data.get("mutation")
            case = cls(str(data["store"]), int(data["steps"]), record, mutation)
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigurationError(
                f"{path} is not a simulation case (a file `oncebox sim` saved)"
            ) from None
        if mutation is not None and not isinstance(mutation, str):
            raise ConfigurationError(f"{path} is not a simulation case (its mutation)")
        return case


Runner = Callable[[Case], Outcome]


def _seen_by(outcome: Outcome) -> int:
    """How many steps a reader of the trace goes through before the failure."""
    return len(outcome.steps) if outcome.at is None else outcome.at


def shrink(case: Case, failed: Outcome, run: Runner, tries: int = 300) -> tuple[Case, Outcome]:
    """The smallest case found that breaks the same invariant as `failed`."""
    assert failed.violation is not None
    wanted = failed.violation.invariant
    best, best_outcome = case, failed
    spent = 0

    def attempt(candidate: Case) -> bool:
        nonlocal best, best_outcome, spent
        if spent >= tries:
            return False
        spent += 1
        outcome = run(candidate)
        if (
            outcome.violation is not None
            and outcome.violation.invariant == wanted
            and _seen_by(outcome) <= _seen_by(best_outcome)
        ):
            best = Case(candidate.store, candidate.steps, list(outcome.record), candidate.mutation)
            best_outcome = outcome
            return True
        return False

    # fewer steps: the failure was seen at step `at`; a shorter main phase may still show it
    low, high = 1, best.steps
    while low < high and spent < tries:
        middle = (low + high) // 2
        if attempt(Case(best.store, middle, best.record, best.mutation)):
            high = middle
        else:
            low = middle + 1
    # fewer choices: delete runs of them, largest first
    size = max(len(best.record) // 2, 1)
    while size >= 1 and spent < tries:
        start, changed = 0, False
        while start < len(best.record) and spent < tries:
            shorter = best.record[:start] + best.record[start + size :]
            if attempt(Case(best.store, best.steps, shorter, best.mutation)):
                changed = True
            else:
                start += size
        if not changed:
            size //= 2
    # simpler choices: each towards 0
    index = 0
    while index < len(best.record) and spent < tries:
        if best.record[index] > 0:
            simpler = list(best.record)
            simpler[index] = 0
            attempt(Case(best.store, best.steps, simpler, best.mutation))
        index += 1
    return best, best_outcome
