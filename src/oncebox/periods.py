"""Periods: the part of a key that names *which* week (day, month) an operation is for.

A period is computed from the schedule's **fire time** in the schedule's timezone — never from the
time a job happens to be processed — so a digest for 2026-W33 that runs after the W34 boundary
still carries W33. One timezone per schedule; per-recipient timezones are out of scope (give each
timezone its own schedule).

ISO weeks are the classic trap: the ISO week-year is not the calendar year. 2025-12-29 is in
2026-W01, and 2027-01-01 is in 2026-W53 (2026 has 53 weeks). `iso_week` uses `isocalendar()` (the
`%G-W%V` pair), never `%Y`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from oncebox.errors import ConfigurationError, InvalidArguments
from oncebox.keys import key_problem

_WEEK_RE = re.compile(r"(\d{4})-W(\d{2})")
_DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MONTH_RE = re.compile(r"(\d{4})-(\d{2})")


def zone(name: str) -> ZoneInfo:
    """A timezone by IANA name, with an error that says which name was wrong."""
    if not isinstance(name, str) or not name or name.lower() == "localtime":
        raise ConfigurationError(f"timezone {name!r}: give an IANA name such as 'Europe/Berlin'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(f"unknown timezone {name!r} ({exc})") from None


def weeks_in_iso_year(year: int) -> int:
    return date(year, 12, 28).isocalendar().week


@dataclass(frozen=True)
class PeriodKind:
    """A named way of turning an instant into a period, and of checking a period's text."""

    name: str
    of: Callable[[datetime], str]
    check: Callable[[str], str]

    def __call__(self, instant: datetime) -> str:
        if instant.tzinfo is None:
            raise ConfigurationError("periods are computed from timezone-aware instants")
        return self.of(instant)


def _check_week(text: str) -> str:
    match = _WEEK_RE.fullmatch(text)
    if not match:
        raise InvalidArguments(f"period {text!r} is not an ISO week such as 2026-W33")
    year, week = int(match.group(1)), int(match.group(2))
    if not 1 <= year <= 9999 or not 1 <= week <= weeks_in_iso_year(year):
        raise InvalidArguments(
            f"period {text!r} does not exist: {year} has {weeks_in_iso_year(year)} ISO weeks"
        )
    return text


def _check_day(text: str) -> str:
    try:
        if not _DAY_RE.fullmatch(text):
            raise ValueError
        date.fromisoformat(text)
    except ValueError:
        raise InvalidArguments(f"period {text!r} is not a day such as 2026-08-17") from None
    return text


def _check_month(text: str) -> str:
    match = _MONTH_RE.fullmatch(text)
    if not match or not 1 <= int(match.group(2)) <= 12 or int(match.group(1)) < 1:
        raise InvalidArguments(f"period {text!r} is not a month such as 2026-08")
    return text


def _iso_week(instant: datetime) -> str:
    year, week, _weekday = instant.isocalendar()
    return f"{year:04d}-W{week:02d}"


def in_zone(kind: PeriodKind, tz: str) -> Callable[[datetime], str]:
    """The period of an instant as seen in timezone `tz`."""
    where = zone(tz)
    return lambda instant: kind(instant.astimezone(where))


iso_week = PeriodKind("iso_week", _iso_week, _check_week)
day = PeriodKind("day", lambda instant: instant.date().isoformat(), _check_day)
month = PeriodKind("month", lambda instant: f"{instant.year:04d}-{instant.month:02d}",
                   _check_month)  # fmt: skip

BUILT_IN = {kind.name: kind for kind in (iso_week, day, month)}


def custom(name: str, of: Callable[[datetime], str]) -> PeriodKind:
    """A user-defined period: any function of the (zoned) fire time whose text is a valid key
    segment, e.g. fortnights or fiscal quarters."""

    def check(text: str) -> str:
        problem = key_problem(text)
        if problem is not None or "/" in text:
            raise InvalidArguments(f"period {text!r} cannot be part of a key: {problem or '/'}")
        return text

    def checked(instant: datetime) -> str:
        return check(of(instant))

    return PeriodKind(name, checked, check)
