"""`Violation`: one broken invariant, for one key, with the evidence. The checker finds them after
a run; the runner records them during it (samples taken while workers are still running)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    invariant: str
    key: str
    evidence: str
