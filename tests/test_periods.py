"""Periods at their edges: ISO week-years, DST, half-hour zones, one instant in several zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncebox import ConfigurationError, InvalidArguments
from oncebox.jobs.keys import validate_key
from oncebox.jobs.periods import custom, day, in_zone, iso_week, month, weeks_in_iso_year
from oncebox.schedules.schedule import make_schedule


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


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


ARABIC_2026 = "\u0662\u0660\u0662\u0666"


FULL_WIDTH_08 = "\uff10\uff18"


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        (iso_week, "0000-W01"),
        (iso_week, f"{ARABIC_2026}-W33"),
        (iso_week, "2026-W\uff13\uff13"),
        (month, "0000-08"),
        (month, f"2026-{FULL_WIDTH_08}"),
        (month, f"{ARABIC_2026}-08"),
        (month, f"{ARABIC_2026}-\u0660\u0668"),
        (day, "0000-08-17"),
        (day, f"2026-{FULL_WIDTH_08}-17"),
        (day, f"{ARABIC_2026}-08-17"),
        (day, f"{ARABIC_2026}-\u0660\u0668-\u0661\u0667"),
    ],
)
def test_a_period_with_year_zero_or_non_ascii_digits_is_invalid_arguments(kind, text):
    with pytest.raises(InvalidArguments, match="period") as caught:
        kind.check(text)
    assert "\n" not in str(caught.value)


def test_year_zero_says_why_in_one_line():
    with pytest.raises(InvalidArguments, match=r"'0000-W01' does not exist: years start at 0001"):
        iso_week.check("0000-W01")
    assert iso_week.check("0001-W01") == "0001-W01"
    assert iso_week.check("9999-W52") == "9999-W52"


@pytest.mark.parametrize("kind", [iso_week, day, month])
def test_a_period_that_is_not_text_or_is_huge_is_refused_with_a_short_message(kind):
    with pytest.raises(InvalidArguments, match="not NoneType"):
        kind.check(None)
    with pytest.raises(InvalidArguments) as caught:
        kind.check("9" * 10**5)
    assert len(str(caught.value)) < 200, len(str(caught.value))


class NoOffset(tzinfo):
    """A tzinfo whose utcoffset() is None: the instant is naive, by Python's definition."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


NAIVE = datetime(2026, 8, 17, 9, 0)


NO_OFFSET = datetime(2026, 8, 17, 9, 0, tzinfo=NoOffset())


def weekly():
    return make_schedule(
        "s",
        cron="0 9 * * MON",
        tz="Europe/Berlin",
        period=iso_week,
        task="t",
        eligible=lambda ctx: [],
    )


@pytest.mark.parametrize("instant", [NAIVE, NO_OFFSET], ids=["naive", "utcoffset-none"])
@pytest.mark.parametrize(
    "call",
    [
        in_zone(month, "UTC"),
        day,
        lambda at: weekly().period_of(at),
        lambda at: weekly().next_fire(at),
        lambda at: weekly().fires_between(at, datetime(2026, 9, 1, tzinfo=UTC)),
        lambda at: weekly().fires_between(datetime(2026, 8, 1, tzinfo=UTC), at),
    ],
    ids=[
        "in_zone",
        "period",
        "period_of",
        "next_fire",
        "fires_between-after",
        "fires_between-until",
    ],
)
def test_an_instant_without_an_offset_is_refused_never_read_as_local_time(call, instant):
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        call(instant)


def test_a_date_is_not_an_instant():
    with pytest.raises(ConfigurationError, match="timezone-aware datetimes, not date"):
        in_zone(iso_week, "UTC")(datetime(2026, 8, 17, tzinfo=UTC).date())  # type: ignore[arg-type]


def test_aware_instants_still_give_their_periods_in_the_schedules_zone():
    late_sunday_utc = datetime(2026, 8, 16, 23, 30, tzinfo=UTC)  # Monday 01:30 in Berlin
    assert in_zone(iso_week, "Europe/Berlin")(late_sunday_utc) == "2026-W34"
    assert weekly().period_of(late_sunday_utc) == "2026-W34"
    assert weekly().next_fire(late_sunday_utc) == datetime(2026, 8, 17, 7, tzinfo=UTC)
    fires = weekly().fires_between(late_sunday_utc, datetime(2026, 8, 25, tzinfo=UTC))
    assert fires == [datetime(2026, 8, 17, 7, tzinfo=UTC), datetime(2026, 8, 24, 7, tzinfo=UTC)]


def test_a_custom_period_refuses_non_text_and_quotes_a_huge_one_briefly():
    fortnight = custom("fortnight", lambda at: "2026-F17")
    with pytest.raises(InvalidArguments, match="not int"):
        fortnight.check(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArguments) as caught:
        fortnight.check("x" * 10**5)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize(
    "tz",
    [
        "",
        "localtime",
        "LocalTime",
        "/etc/localtime",
        "../../etc/passwd",
        "Europe/../UTC",
        "UTC\x00",
        "Europe/Berlin ",
        "\u202eUTC",
        "utc+2",
        None,
        5,
    ],
)
def test_a_schedule_in_a_bad_timezone_is_refused_and_not_registered(sqlite_url, open_box, tz):
    box = open_box(sqlite_url)

    @box.task(key="digest/{period}")
    def digest(ctx, period: str) -> None:
        pass

    with pytest.raises(ConfigurationError, match="timezone"):
        box.schedule("weekly", cron="0 9 * * MON", period=iso_week, task="digest", tz=tz)(
            lambda ctx: []
        )
    assert box.schedules == {}


@given(st.from_regex(r"[0-9]{4}-W[0-9]{2}", fullmatch=True).filter(lambda p: p[:4] != "0000"))
def test_a_week_text_is_either_refused_or_a_real_week_usable_in_a_key(text):
    try:
        checked = iso_week.check(text)
    except InvalidArguments:
        return
    validate_key(f"digest/{checked}")
    monday = datetime.fromisocalendar(int(text[:4]), int(text[-2:]), 1).replace(tzinfo=UTC)
    assert iso_week(monday) == text
