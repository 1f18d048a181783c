"""Periods at their edges: ISO week-years, DST, half-hour zones, one instant in several zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncebox import ConfigurationError, InvalidArguments
from oncebox.jobs.periods import custom, day, in_zone, iso_week, month, weeks_in_iso_year
from oncebox.schedules.schedule import make_schedule


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("instant", "week"),
    [
        (utc(2026, 8, 17, 9), "2026-W34"),
        (utc(2025, 12, 29, 12), "2026-W01"),  # %Y would say 2025: the trap
        (utc(2027, 1, 1, 12), "2026-W53"),  # 2026 has 53 ISO weeks
        (utc(2026, 12, 31, 12), "2026-W53"),
        (utc(2027, 1, 4, 0), "2027-W01"),
        (utc(2021, 1, 3, 23, 59), "2020-W53"),
    ],
)
def test_iso_weeks_use_the_iso_week_year(instant, week):
    assert iso_week(instant) == week


def test_2026_has_53_weeks_and_2027_has_52():
    assert (weeks_in_iso_year(2026), weeks_in_iso_year(2027)) == (53, 52)
    assert iso_week.check("2026-W53") == "2026-W53"
    for bad in ("2027-W53", "2026-W00", "2026-W54", "2026-W5", "2026W33", "2026-w33"):
        with pytest.raises(InvalidArguments):
            iso_week.check(bad)


def test_one_instant_falls_in_different_weeks_in_different_zones():
    instant = utc(2026, 8, 16, 13)  # Sunday afternoon in Europe, Monday morning in Auckland
    weeks = {
        tz: in_zone(iso_week, tz)(instant)
        for tz in ("Pacific/Auckland", "Europe/Berlin", "America/Los_Angeles", "Pacific/Pago_Pago")
    }
    assert weeks == {
        "Pacific/Auckland": "2026-W34",
        "Europe/Berlin": "2026-W33",
        "America/Los_Angeles": "2026-W33",
        "Pacific/Pago_Pago": "2026-W33",
    }


def schedule(cron: str, tz: str):
    return make_schedule("s", cron=cron, tz=tz, period=iso_week, task="t", eligible=lambda ctx: [])


def test_a_0230_schedule_fires_once_on_the_spring_forward_day_at_0300():
    fires = schedule("30 2 * * *", "Europe/Berlin").fires_between(
        utc(2026, 3, 28, 12), utc(2026, 3, 30, 12)
    )
    local = [f.astimezone(ZoneInfo("Europe/Berlin")).isoformat() for f in fires]
    assert local == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]


def test_a_0230_schedule_fires_once_on_the_fall_back_day_at_the_first_0230():
    fires = schedule("30 2 * * *", "Europe/Berlin").fires_between(
        utc(2026, 10, 24, 12), utc(2026, 10, 26, 12)
    )
    assert [f.isoformat() for f in fires] == [
        "2026-10-25T00:30:00+00:00",  # 02:30 CEST, the first of the two 02:30s
        "2026-10-26T01:30:00+00:00",  # 02:30 CET
    ]


def test_an_hourly_schedule_runs_each_hour_once_across_the_fall_back_hour():
    fires = schedule("0 * * * *", "America/New_York").fires_between(
        utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 8, 30)
    )
    assert len(fires) == len(set(fires)) == 4  # 01:00 EDT, 01:00 EST, 02:00, 03:00 local


@pytest.mark.parametrize(
    ("tz", "utc_hour", "utc_minute"),
    [("Asia/Kolkata", 3, 45), ("Asia/Kathmandu", 3, 30), ("Australia/Lord_Howe", 22, 45)],
)
def test_half_hour_zones(tz, utc_hour, utc_minute):
    [fire] = schedule("15 9 * * MON", tz).fires_between(utc(2026, 8, 16), utc(2026, 8, 18))
    assert (fire.hour, fire.minute) == (utc_hour, utc_minute)
    assert schedule("15 9 * * MON", tz).period_of(fire) == "2026-W34"


def test_days_months_and_custom_periods():
    instant = utc(2026, 8, 17, 9)
    assert (day(instant), month(instant)) == ("2026-08-17", "2026-08")
    fortnight = custom(
        "fortnight", lambda at: f"{at.isocalendar().year}-F{(at.isocalendar().week + 1) // 2:02d}"
    )
    assert fortnight(instant) == "2026-F17"
    with pytest.raises(InvalidArguments):
        custom("bad", lambda at: "a/b")(instant)
    with pytest.raises(ConfigurationError):
        iso_week(datetime(2026, 8, 17))  # naive


@pytest.mark.parametrize("tz", ["", "localtime", "Mars/Olympus", "utc+2"])
def test_bad_timezones_are_refused_at_declaration(tz):
    with pytest.raises(ConfigurationError):
        schedule("0 9 * * MON", tz)


def test_bad_cron_is_refused_at_declaration():
    with pytest.raises(ConfigurationError, match="cron"):
        schedule("0 25 * * MON", "UTC")


@given(
    st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    )
)
def test_iso_week_always_names_an_existing_week(instant):
    week = iso_week(instant)
    assert iso_week.check(week) == week
    year = int(week[:4])
    assert abs(year - instant.year) <= 1
    monday = datetime.fromisocalendar(year, int(week[-2:]), 1).replace(tzinfo=UTC)
    assert monday <= instant < monday + timedelta(days=7)
