"""Periods: the part of a key that names *which* week (day, month) an operation is for.

A period is computed from the schedule's **fire time** in the schedule's timezone — never from the
time a job happens to be processed — so a digest for 2026-W33 that runs after the W34 boundary
still carries W33. One timezone per schedule; per-recipient timezones are out of scope (give each
timezone its own schedule).

ISO weeks are the classic trap: the ISO week-year is not the calendar year. 2025-12-29 is in
2026-W01, and 2027-01-01 is in 2026-W53 (2026 has 53 weeks). `iso_week` uses `isocalendar()` (the
`%G-W%V` pair), never `%Y`.

Period texts are checked against ASCII `[0-9]`: a regex's digit class and `int()` also take other
scripts' digits (Arabic-Indic, full-width), which would pass the check and then fail as a key
(keys are ASCII) once a schedule run had been claimed. Instants must be timezone-aware: a naive
one would silently be read in the host's local zone.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from oncebox.jobs.keys import key_problem
from oncebox.kernel.errors import ConfigurationError, InvalidArguments

_WEEK_RE = re.compile(r"([0-9]{4})-W([0-9]{2})")
_DAY_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_MONTH_RE = re.compile(r"([0-9]{4})-([0-9]{2})")
_SHOWN = 40  # characters of a refused period quoted in its error


def _shown(text: str) -> str:
    """A refused period quoted for a one-line message: shortened, control characters escaped."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArguments(f"a period is text such as 2026-W33, not {type(value).__name__}")
    return value


def aware(instant: datetime, what: str = "periods are computed from") -> datetime:
    """`instant`, if it is a timezone-aware datetime; a naive one is refused rather than read in
    the host's local zone (what `astimezone()` would do with it)."""
    if not isinstance(instant, datetime):
        raise ConfigurationError(f"{what} timezone-aware datetimes, not {type(instant).__name__}")
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ConfigurationError(
            f"{what} timezone-aware instants, not naive ones (e.g. datetime(..., tzinfo=UTC))"
        )
    return instant


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
        return self.of(aware(instant))


def _check_week(text: str) -> str:
    match = _WEEK_RE.fullmatch(_text(text))
    if not match:
        raise InvalidArguments(f"period {_shown(text)} is not an ISO week such as 2026-W33")
    year, week = int(match.group(1)), int(match.group(2))
    if year < 1:  # date(0, ...) does not exist: no week count to quote
        raise InvalidArguments(f"period {_shown(text)} does not exist: years start at 0001")
    if not 1 <= week <= weeks_in_iso_year(year):
        raise InvalidArguments(
            f"period {_shown(text)} does not exist: {year} has {weeks_in_iso_year(year)} ISO weeks"
        )
    return text


def _check_day(text: str) -> str:
    try:
        if not _DAY_RE.fullmatch(_text(text)):
            raise ValueError
        date.fromisoformat(text)
    except ValueError:
        raise InvalidArguments(f"period {_shown(text)} is not a day such as 2026-08-17") from None
    return text


def _check_month(text: str) -> str:
    match = _MONTH_RE.fullmatch(_text(text))
    if not match or not 1 <= int(match.group(2)) <= 12 or int(match.group(1)) < 1:
        raise InvalidArguments(f"period {_shown(text)} is not a month such as 2026-08")
    return text


def _iso_week(instant: datetime) -> str:
    year, week, _weekday = instant.isocalendar()
    return f"{year:04d}-W{week:02d}"


def in_zone(kind: PeriodKind, tz: str) -> Callable[[datetime], str]:
    """The period of an instant as seen in timezone `tz`."""
    where = zone(tz)
    return lambda instant: kind(aware(instant).astimezone(where))


iso_week = PeriodKind("iso_week", _iso_week, _check_week)
day = PeriodKind("day", lambda instant: instant.date().isoformat(), _check_day)
month = PeriodKind("month", lambda instant: f"{instant.year:04d}-{instant.month:02d}",
                   _check_month)  # fmt: skip

BUILT_IN = {kind.name: kind for kind in (iso_week, day, month)}


def custom(name: str, of: Callable[[datetime], str]) -> PeriodKind:
    """A user-defined period: any function of the (zoned) fire time whose text is a valid key
    segment, e.g. fortnights or fiscal quarters."""

    def check(text: str) -> str:
        problem = key_problem(_text(text))
        if problem is not None or "/" in text:
            raise InvalidArguments(
                f"period {_shown(text)} cannot be part of a key: {problem or '/'}"
            )
        return text

    def checked(instant: datetime) -> str:
        return check(of(instant))

    return PeriodKind(name, checked, check)
