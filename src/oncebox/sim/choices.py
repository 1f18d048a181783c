"""Every choice a run makes, as a sequence of numbers: drawn from a seed, recorded, replayed.

A run asks `below(n)` (which actor moves, which fault, which key, how far the clock goes) and
`chance(p)`. Drawn from the seed, each answer is also recorded; replaying the record gives the
same run, and a shorter or smaller record gives a simpler one — which is how a failure shrinks
(`shrink.py`): the shrinker edits the record, never the code. Past the end of a record every
answer is 0, the simplest (the first actor, no fault, the first key).
"""

from __future__ import annotations

import random


class Choices:
    def __init__(self, seed: int | None = None, record: list[int] | None = None) -> None:
        self._rng = random.Random(seed) if record is None else None
        self._given = list(record) if record is not None else []
        self.made: list[int] = []

    def below(self, n: int) -> int:
        """A number in [0, n)."""
        if n <= 1:
            return 0
        if self._rng is not None:
            value = self._rng.randrange(n)
        else:
            index = len(self.made)
            value = self._given[index] % n if index < len(self._given) else 0
        self.made.append(value)
        return value

    def chance(self, p: float) -> bool:
        """True with probability `p` (to a thousandth); False past a record's end."""
        return self.below(1000) >= 1000 - round(p * 1000)
