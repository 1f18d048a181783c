"""Deprecated: the period kinds live in `oncebox.jobs.periods` (`from oncebox.jobs.periods import
iso_week`). Importing this module warns, naming that import, and still gives the same names."""

from __future__ import annotations

import warnings

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

warnings.warn(
    "oncebox.periods is deprecated: import from oncebox.jobs.periods",
    DeprecationWarning,
    stacklevel=2,
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
