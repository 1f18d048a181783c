"""Rates as people write them: ``"14/s"``, ``"600/min"``, ``"50000/day"`` — a count per period,
read once where a channel or a task declares it. A token bucket holds at most `count` tokens
and refills at `count / period` (`outbox/ratelimit.py` takes from the channels',
`store/allocation.py` from the tasks')."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

from oncebox.kernel.errors import ConfigurationError

_PERIODS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hour": 3600,
    "d": 86_400,
    "day": 86_400,
}
_LIMIT_RE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*")


@dataclass(frozen=True)
class Limit:
    """At most `count` sends per `period`, with bursts up to `count`."""

    count: int
    period: timedelta
    name: str

    @classmethod
    def parse(cls, text: str) -> Limit:
        match = _LIMIT_RE.fullmatch(text.lower())
        unit = match.group(3) if match else ""
        if not match or (unit.rstrip("s") not in _PERIODS and unit not in _PERIODS):
            raise ConfigurationError(
                f"rate limit {text!r} is not COUNT/PERIOD, e.g. '14/s', '600/min', '50000/day'"
            )
        count = int(match.group(1))
        seconds = _PERIODS.get(unit, _PERIODS.get(unit.rstrip("s"), 0)) * int(match.group(2) or 1)
        if unit == "ms" or seconds <= 0:
            raise ConfigurationError(f"rate limit {text!r}: the period must be at least a second")
        if count < 1:
            raise ConfigurationError(f"rate limit {text!r} must allow at least one send")
        return cls(count, timedelta(seconds=seconds), text.strip().replace(" ", ""))

    @property
    def refill_per_s(self) -> float:
        return self.count / self.period.total_seconds()
