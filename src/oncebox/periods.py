"""Compatibility: the period kinds live in `oncebox.jobs.periods`; this module keeps the name the
README and guide use (`from oncebox.periods import iso_week`, `oncebox.periods.custom(...)`)."""

from __future__ import annotations

from oncebox.jobs.periods import (
    BUILT_IN,
    PeriodKind,
    aware,
    custom,
    day,
    in_zone,
    iso_week,
    month,
    weeks_in_iso_year,
    zone,
)

__all__ = [
    "BUILT_IN",
    "PeriodKind",
    "aware",
    "custom",
    "day",
    "in_zone",
    "iso_week",
    "month",
    "weeks_in_iso_year",
    "zone",
]
