"""A schedule's promise, and how a period keeps it: the delivery-window SLO.

    @box.schedule("weekly-digest", cron="0 9 * * MON", period=iso_week, task=weekly_digest,
                  slo=Slo(deliver_within="4h", target=0.995))

The SLI of a period is the share of its eligible subjects *on time*: covered (the job done and
every message it wrote sent) within `deliver_within` of the period's fire time — a subject found
by a later re-scan included, its window starting at the fire too. The error budget is the
subjects that may miss before the target is broken. The on-call person is paged on the budget,
not on retries (the Google SRE workbook's burn-rate alerting, adapted to a batch promise of
hours): while the window is open, a dead job or message and a send held `ambiguous` are certain
misses (a person must act for them to arrive), and the subjects still waiting are projected from
the rate of on-time deliveries so far over the time left. `at_risk` says the projection exceeds
the budget — early enough to act. Everything here is computed from the rows
(`Store.schedule_period_stats` with the window), so a test can check it from them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from oncebox.kernel.errors import ConfigurationError
from oncebox.store.records import PeriodStats

_DURATION_RE = re.compile(r"(\d+)\s*(d|h|m|min|s)")
_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "min": 60, "s": 1}


def parse_window(text: str | timedelta) -> timedelta:
    """`4h`, `90m`, `1h30m`, `2d` or a timedelta: a positive delivery window."""
    if isinstance(text, timedelta):
        window = text
    else:
        cleaned = text.strip().lower().replace(" ", "")
        parts = _DURATION_RE.findall(cleaned)
        if not parts or "".join(n + u for n, u in parts) != cleaned:
            raise ConfigurationError(
                f"deliver_within {text!r} is not a duration like '4h', '90m' or '1h30m'"
            )
        window = timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in parts))
    if not timedelta(0) < window <= timedelta(days=366):
        raise ConfigurationError(f"deliver_within {text!r} must be within 1 s .. 366 days")
    return window


@dataclass(frozen=True, slots=True, init=False)
class Slo:
    """Deliver to `target` (a share, e.g. 0.995) of a period's eligible subjects within
    `deliver_within` of the fire."""

    deliver_within: timedelta
    target: float

    def __init__(self, deliver_within: str | timedelta, target: float) -> None:
        if not (isinstance(target, int | float) and 0 < target < 1 and math.isfinite(target)):
            raise ConfigurationError(f"an SLO's target {target!r} must be a share in (0, 1)")
        object.__setattr__(self, "deliver_within", parse_window(deliver_within))
        object.__setattr__(self, "target", float(target))

    def assess(self, stats: PeriodStats, now: datetime) -> PeriodSlo | None:
        """How `stats` (read with this SLO's window) keeps the promise at `now`; None for a
        period without a fire (a run by hand) or an eligible count (no complete scan yet)."""
        if stats.fire_at is None or stats.eligible is None or stats.on_time is None:
            return None
        eligible, on_time = stats.eligible, min(stats.on_time, stats.eligible)
        ends = stats.fire_at + self.deliver_within
        allowed = math.floor(eligible * (1 - self.target) + 1e-9)
        if now >= ends:
            misses = eligible - on_time
            projected = misses
        else:
            stuck = stats.dead_subjects + stats.held_subjects  # subjects, not messages
            misses = min(stuck, eligible - on_time)
            waiting = eligible - on_time - misses
            elapsed = (now - stats.fire_at).total_seconds()
            rate = on_time / elapsed if elapsed > 0 else 0.0
            arriving = rate * (ends - now).total_seconds()
            projected = misses + max(0, math.ceil(waiting - arriving - 1e-9))
        return PeriodSlo(
            window_ends_at=ends,
            closed=now >= ends,
            on_time=on_time,
            sli=on_time / eligible if eligible else None,
            allowed_misses=allowed,
            misses=misses,
            budget_left=allowed - misses,
            projected_misses=projected,
            at_risk=projected > allowed,
        )


@dataclass(frozen=True, slots=True)
class PeriodSlo:
    """One period against its schedule's SLO (see the module docstring)."""

    window_ends_at: datetime
    closed: bool  # the window has ended: the figures are final
    on_time: int
    sli: float | None  # on_time / eligible
    allowed_misses: int  # the error budget: eligible x (1 - target), rounded down
    misses: int  # certain so far: late once the window ends, dead and ambiguous before
    budget_left: int  # allowed - misses: below 0, the promise is broken
    projected_misses: int  # misses, and the waiting subjects the current rate will not reach
    at_risk: bool  # projected_misses > allowed_misses
