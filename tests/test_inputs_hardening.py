"""Bad inputs refused where they enter — periods and instants, HTTP answers, database URLs, command
line values and ids — as a clear oncebox error (a command: one line, exit 2) with nothing written
and no secret echoed. The cases tests/test_fuzz_inputs.py found are pinned there; these pin the
neighbouring cases each fix covers too.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any

import httpx2
import pytest
from click.testing import CliRunner, Result

from oncebox import Box
from oncebox.cli.app import main
from oncebox.cli.run_cmds import typed_arguments
from oncebox.errors import ConfigurationError, InvalidArguments
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.jobs.periods import PeriodKind, custom, day, in_zone, iso_week, month
from oncebox.providers import Receipt, from_url
from oncebox.providers.base import SendPermanent, SendRetryable
from oncebox.providers.http import HttpEmailProvider
from oncebox.schedules.schedule import make_schedule
from oncebox.store import open_store
from oncebox.store.postgres import PostgresStore, redact, split_url

SECRET = "test-secret-not-for-production"
ARABIC_2026 = "\u0662\u0660\u0662\u0666"
FULL_WIDTH_08 = "\uff10\uff18"

# ==============================================================================================
# Periods and instants
# ==============================================================================================


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        (iso_week, "0000-W01"),
        (iso_week, f"{ARABIC_2026}-W33"),
        (iso_week, "2026-W\uff13\uff13"),
        (month, "0000-08"),
        (month, f"2026-{FULL_WIDTH_08}"),
        (month, f"{ARABIC_2026}-08"),
        (day, "0000-08-17"),
        (day, f"2026-{FULL_WIDTH_08}-17"),
        (day, f"{ARABIC_2026}-08-17"),
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


NAIVE = datetime(2026, 8, 17, 9, 0)
NO_OFFSET = datetime(2026, 8, 17, 9, 0, tzinfo=NoOffset())


def weekly():
    return make_schedule(
        "s", cron="0 9 * * MON", tz="Europe/Berlin", period=iso_week, task="t", eligible=list
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


def test_a_manual_run_of_a_period_that_cannot_be_a_key_claims_nothing(sqlite_url, open_box):
    """A hand-built PeriodKind whose check lets anything through: run_schedule checks the
    period as a key segment too, before the run is claimed."""
    box = open_box(sqlite_url, secret=SECRET)
    lax = PeriodKind("lax", iso_week.of, lambda text: text)

    @box.task(key="digest/{period}")
    def digest(ctx, period: str) -> None:
        pass

    @box.schedule("lax", cron="0 9 * * MON", period=lax, task="digest")
    def eligible(ctx):
        yield {"period": ctx.period}

    for period in (f"{ARABIC_2026}-W33", "2026/W33", "x" * 10**4):
        with pytest.raises(InvalidArguments, match="cannot be part of a key") as caught:
            box.run_schedule("lax", period)
        assert len(str(caught.value)) < 400
    assert box.store.schedule_run_list("lax") == []
    assert box.store.job_count_by_state().counts == {}


def test_a_custom_period_refuses_non_text_and_quotes_a_huge_one_briefly():
    fortnight = custom("fortnight", lambda at: "2026-F17")
    with pytest.raises(InvalidArguments, match="not int"):
        fortnight.check(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArguments) as caught:
        fortnight.check("x" * 10**5)
    assert len(str(caught.value)) < 300


# ==============================================================================================
# HTTP answers
# ==============================================================================================


def answer(status: int, body: bytes, content_type: str = "application/json") -> httpx2.Response:
    return httpx2.Response(
        status,
        content=body,
        headers={"content-type": content_type},
        request=httpx2.Request("POST", "http://fake.example/emails"),
    )


DEEP = b"[" * 10**5 + b"]" * 10**5


@pytest.fixture
def http_provider() -> Iterator[HttpEmailProvider]:
    provider = from_url("resend+http://127.0.0.1:9?timeout=1")
    assert isinstance(provider, HttpEmailProvider)
    yield provider
    provider.close()


def test_a_body_too_deep_to_parse_counts_as_no_body_whatever_the_status(http_provider):
    for status in (200, 201):
        receipt = http_provider._classify(answer(status, DEEP))
        assert isinstance(receipt, Receipt) and receipt.provider_id is None
        assert len(receipt.detail) <= 600
    with pytest.raises(SendRetryable, match="in progress"):  # an unknown 409 code
        http_provider._classify(answer(409, DEEP))
    with pytest.raises(SendPermanent, match="HTTP 422"):
        http_provider._classify(answer(422, DEEP))
    with pytest.raises(SendRetryable, match="HTTP 503"):
        http_provider._classify(answer(503, DEEP))


def test_a_425_too_early_is_retryable_and_honours_retry_after():
    with FakeEmailApi() as api:
        api.script("425:30", "425")
        provider = from_url(f"{api.url}?timeout=5")
        try:
            outcomes = []
            for _ in range(2):
                try:
                    provider.send(_outgoing(), "idem-425")
                except SendRetryable as exc:
                    outcomes.append(exc)
        finally:
            provider.close()  # type: ignore[attr-defined]
        assert [o.retry_after for o in outcomes] == [timedelta(seconds=30), None]
        assert all("HTTP 425" in o.reason for o in outcomes)
        assert api.delivered == []


def _outgoing() -> Any:
    from oncebox.providers import Outgoing

    return Outgoing(
        1,
        "email",
        "a" * 32,
        {
            "to": ["x@y.example"],
            "from": "digest@oncebox.example",
            "subject": "s",
            "text": "t",
            "date": "Mon, 17 Aug 2026 09:00:00 +0000",
            "headers": {},
        },
        1,
    )


# ==============================================================================================
# Database URLs
# ==============================================================================================


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://bob:s3cret@h:5432/db", "postgresql://bob:***@h:5432/db"),
        ("postgresql://bob:s3cr%40t@h/db", "postgresql://bob:***@h/db"),
        ("postgresql://bob:s3c@ret@h/db", "postgresql://bob:***@h/db"),  # an unencoded @
        ("postgresql://bob:s3cret@[::1/db", "postgresql://bob:***@[::1/db"),  # not a valid URL
        ("postgresql://h/db?password=s3cret", "postgresql://h/db?password=***"),
        (
            "postgresql://h/db?sslmode=require&PASSWORD=s3cret&connect_timeout=2",
            "postgresql://h/db?sslmode=require&PASSWORD=***&connect_timeout=2",
        ),
        ("postgresql://h/db?sslpassword=s3cret", "postgresql://h/db?sslpassword=***"),
        (
            "postgresql://bob:s3cret@h/db?password=s3cret2",
            "postgresql://bob:***@h/db?password=***",
        ),
        ("host=h password=s3cret dbname=x", "host=h password=*** dbname=x"),
        ("host=h password = 's3 cret' dbname=x", "host=h password = *** dbname=x"),
        (
            "postgresql://bob@h:5432/db?connect_timeout=2",
            "postgresql://bob@h:5432/db?connect_timeout=2",
        ),
        ("postgresql:///db?host=/run/postgresql", "postgresql:///db?host=/run/postgresql"),
        ("sqlite:///path/x.db", "sqlite:///path/x.db"),
        ("postgresql://bob:s3cret@h/db\n\x1b[31m", "postgresql://bob:***@h/db\\n\\x1b[31m"),
    ],
)
def test_redact_hides_every_password_and_leaves_the_rest_as_written(url, shown):
    assert redact(url) == shown
    assert "s3c" not in redact(url)


@pytest.mark.parametrize(
    ("url", "conninfo", "ours"),
    [
        ("postgresql:///mydb", "postgresql:///mydb", {}),
        (
            "postgres:///db?host=127.0.0.1&port=1&schema=s&pool_max=3",
            "postgresql:///db?host=127.0.0.1&port=1",
            {"schema": "s", "pool_max": "3"},
        ),
        (
            "postgresql://u@h/db?options=-c%20search_path%3Dx&connect_timeout=2",
            "postgresql://u@h/db?options=-c%20search_path%3Dx",
            {"connect_timeout": "2"},
        ),
        ("postgresql://h1:1,h2:2/db", "postgresql://h1:1,h2:2/db", {}),
        ("postgresql://[::1]:5432/db", "postgresql://[::1]:5432/db", {}),
    ],
    ids=["socket", "hostless-with-options", "encoded-option-kept", "multi-host", "ipv6"],
)
def test_split_url_keeps_what_libpq_receives_as_written(url, conninfo, ours):
    assert split_url(url) == (conninfo, ours)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql://bob:s3cret@[::1/db", 'matching "]"'),
        ("postgresql://bob:s3cret@127.0.0.1:notaport/db", "port 'notaport'"),
        ("postgresql://bob:s3cret@127.0.0.1:99999/db", "port '99999'"),
        ("postgresql://bob:s3cret@127.0.0.1:" + "9" * 5000 + "/db", "is not a number"),
        ("postgresql://bob:s3cret@h/db?port=5432,x", "port 'x'"),
        ("postgresql://bob:s3cret@h/db?bogus=1", 'invalid URI query parameter: "bogus"'),
        ("postgresql://bob:s3cr%zzt@h/db", "invalid percent-encoded token"),
        ("postgresql://bob:s3cret@h/db\x00", "contains a NUL"),
        ("postgresql://bob:s3cret@h/db?bogus\x1b=1", "bogus\\x1b"),
    ],
)
def test_a_malformed_postgresql_url_is_a_configuration_error_without_the_password(url, needle):
    with pytest.raises(ConfigurationError, match="malformed") as caught:
        open_store(url)
    message = str(caught.value)
    assert needle in message and "s3c" not in message, message
    assert len(message) < 300 and "\n" not in message


@pytest.mark.parametrize(
    "query", ["connect_timeout=nan", "connect_timeout=-1", "pool_min=-1", "pool_max=0"]
)
def test_pool_options_out_of_range_are_configuration_errors(query):
    with pytest.raises(ConfigurationError, match="must be numbers"):
        PostgresStore(f"postgresql://bob:s3cret@127.0.0.1:1/db?{query}")


@pytest.mark.parametrize(
    "url",
    [
        "host=127.0.0.1 password=s3cret dbname=db",
        "password=s3cret host=h://x",  # a '://' after text that is no scheme
        "s3cret",
        "",
    ],
)
def test_text_that_is_not_a_url_is_refused_without_being_echoed(url):
    with pytest.raises(ConfigurationError, match="is not a URL") as caught:
        open_store(url)
    assert "s3cret" not in str(caught.value)


def test_a_sqlite_url_with_a_host_part_is_refused_without_being_echoed():
    for url in ("sqlite://bob:s3cret@host/x.db", "sqlite://bob:s3cret@[x/db"):
        with pytest.raises(ConfigurationError, match="has a host part") as caught:
            open_store(url)
        assert "s3cret" not in str(caught.value)


# ==============================================================================================
# Command-line values and ids
# ==============================================================================================


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def refused(result: Result, code: int = 2) -> str:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), result.exc_info
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "unexpected" not in lines[0] and "Traceback" not in result.output
    return lines[0]


@pytest.fixture
def note_task(sqlite_url, open_box) -> Any:
    box = open_box(sqlite_url, secret=SECRET)

    @box.task(key="note/{name}")
    def note(ctx, name: str, count: int = 0, data: Any = None) -> None:
        pass

    return box.registry.resolve("note")


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"data": '{"a": {"x": 1, "x": 2}}'}, "names 'x' more than once"),
        ({"data": '[{"y": 1, "y": 1}]'}, "names 'y' more than once"),
        ({"data": "[" * 10**5 + "]" * 10**5}, "nested deeper than 32"),
        ({"data": "1" * 5000}, "holds a number longer than 4300 digits"),
        ({"data": '{"a": [' + "9" * 5000 + "]}"}, "holds a number longer than 4300 digits"),
        ({"count": "1" * 5000}, "is an int longer than 4300 digits"),
        ({"count": "\u0664\u0662"}, "is an int: '\\u0664\\u0662'"),
        ({"count": "\uff14\uff12"}, "is an int"),
        ({"name": "ok\udcff"}, "is not UTF-8 text: '\\udcff'"),
        ({"data": "\ud800"}, "is not UTF-8 text"),
        ({"count": "\udcff"}, "is not UTF-8 text"),
    ],
)
def test_cli_values_that_cannot_be_taken_faithfully_are_invalid_arguments(note_task, raw, needle):
    with pytest.raises(InvalidArguments) as caught:
        typed_arguments(note_task, raw)
    message = str(caught.value)
    assert needle in message, message
    assert message.startswith(f"argument {next(iter(raw))!r} of task 'note'")
    assert len(message) < 300 and message.isprintable()


def test_cli_values_that_are_fine_are_typed_as_before(note_task):
    assert typed_arguments(
        note_task,
        {"name": "a", "count": " 01", "data": '{"x": 1, "y": [1, {"x": 2}]}'},
    ) == {"name": "a", "count": 1, "data": {"x": 1, "y": [1, {"x": 2}]}}
    assert typed_arguments(note_task, {"data": "not json"}) == {"data": "not json"}
    assert typed_arguments(note_task, {"data": "-42"}) == {"data": -42}


@pytest.fixture
def cli_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    Box(url).close()
    return url


@pytest.mark.parametrize("ref", ["\u00b2", "\u0664\u0662", "\uff14\uff12", "1\u00b9"])
@pytest.mark.parametrize(
    "command",
    [
        ("jobs", "show"),
        ("jobs", "cancel", "--reason", "x"),
        ("outbox", "show"),
        ("outbox", "resolve", "--sent", "--reason", "x"),
        ("dlq", "show"),
        ("dlq", "replay", "--reason", "x"),
    ],
    ids=lambda c: "-".join(c[:2]) if isinstance(c, tuple) else None,
)
def test_digits_that_are_not_ascii_are_no_id_on_any_command(cli_db, command, ref):
    message = refused(invoke(*command[:2], ref, *command[2:], "--db", cli_db))
    assert "no " in message and "with id or key" in message, message


def test_an_ascii_id_is_still_looked_up_as_an_id(cli_db):
    box = Box(cli_db, secret=SECRET)
    try:

        @box.task(key="k/{n}")
        def keyed(ctx, n: int) -> None:
            pass

        job_id = box.enqueue(keyed, n=1).job_id
    finally:
        box.close()
    result = invoke("jobs", "show", str(job_id), "--db", cli_db, "--json")
    assert result.exit_code == 0, result.output
    assert "k/1" in result.stdout
    assert "no job with id or key '999'" in refused(invoke("jobs", "show", "999", "--db", cli_db))


@pytest.fixture
def pinned_app(tmp_path: Path, monkeypatch) -> Iterator[str]:
    """An app whose Box names its own database, so any other --db differs."""
    name = f"pinned_{uuid.uuid4().hex[:10]}"
    url = f"sqlite:///{tmp_path / 'pinned.db'}"
    (tmp_path / f"{name}.py").write_text(f"from oncebox import Box\n\nbox = Box({url!r})\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("ONCEBOX_DB", url)
    monkeypatch.setenv("ONCEBOX_SECRET", SECRET)
    yield name
    module = sys.modules.pop(name, None)
    if module is not None:
        module.box.close()


def test_a_differing_db_is_named_without_its_password(pinned_app):
    db = "postgresql://bob:s3cret@127.0.0.1:1/db?password=s3cret"
    message = refused(invoke("status", "--app", pinned_app, "--db", db))
    assert "--db postgresql://bob:***@127.0.0.1:1/db?password=*** differs" in message
    assert "s3cret" not in message


@pytest.mark.parametrize(
    "db",
    [
        "postgresql://bob:s3cret@[::1/db",
        "postgresql://bob:s3cret@127.0.0.1:notaport/db",
        "postgresql://bob:s3cret@h/db?bogus=1",
        "host=127.0.0.1 password=s3cret dbname=db",
    ],
)
def test_every_command_refuses_a_malformed_db_as_a_usage_error(db):
    for command in (("status",), ("migrate",), ("jobs", "list"), ("dlq", "list")):
        message = refused(invoke(*command, "--db", db))
        assert "s3cret" not in message, message
