"""Capacity planning for a schedule's run: how many sends it takes, how fast they must go to fit
the delivery window, and whether the consumers or the channel's rate limit set the pace.

A run's work is its eligible subjects times the attempts a delivery takes; what matters is the
peak over the real delivery window, not the week's average (a weekly digest is a burst of hours,
then nothing). Every input says where it came from — measured from the store's last periods and
counters, given on the command line, or assumed — so a reader can tell a forecast from a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
Source = Literal["measured", "declared", "given", "assumed"]


@dataclass(frozen=True, slots=True)
class Input(Generic[T]):
    value: T
    source: Source
    note: str = ""


@dataclass(frozen=True, slots=True)
class Plan:
    sends: int  # eligible x attempts per delivery, rounded up
    needed_per_s: float  # to finish within the window
    rate_limit_per_s: float | None  # the channel's, if known
    per_lane_per_s: float | None  # one consumer lane's measured or given pace
    lanes_needed: int | None  # consumer lanes to keep up with the needed rate
    bottleneck: Literal["rate limit", "consumers", "none"]
    drain: timedelta | None  # the run's time to drain with `lanes` lanes and the limit
    fits: bool | None  # the drain fits the window (None: a pace is unknown)


def plan(
    *,
    eligible: Input[int],
    attempts: Input[float],
    window: Input[timedelta],
    rate_limit_per_s: Input[float | None],
    per_lane_per_s: Input[float | None],
    lanes: Input[int],
) -> Plan:
    sends = math.ceil(eligible.value * max(attempts.value, 1.0))
    needed = sends / window.value.total_seconds()
    per_lane, limit = per_lane_per_s.value, rate_limit_per_s.value
    lanes_needed = None if not per_lane else max(1, math.ceil(needed / per_lane))
    pace = None if not per_lane else per_lane * lanes.value
    if limit is not None:
        pace = limit if pace is None else min(pace, limit)
    if limit is not None and needed > limit:
        bottleneck: Literal["rate limit", "consumers", "none"] = "rate limit"
    elif lanes_needed is not None and lanes_needed > lanes.value:
        bottleneck = "consumers"
    else:
        bottleneck = "none"
    drain = None if not pace else timedelta(seconds=sends / pace)
    return Plan(
        sends=sends,
        needed_per_s=needed,
        rate_limit_per_s=limit,
        per_lane_per_s=per_lane,
        lanes_needed=lanes_needed,
        bottleneck=bottleneck,
        drain=drain,
        fits=None if drain is None else drain <= window.value,
    )
