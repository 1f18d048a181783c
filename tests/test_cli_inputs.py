"""The command line's inputs, in process (click's runner): values typed faithfully or refused,
ids that are not ASCII digits, `--limit` bounds, unknown commands and flags, `--db` URLs and
the apps' enqueue values — each refused with one line (exit 2; 1 when the server refuses),
never a traceback, never a password.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from conftest import PG_URL
from oncebox import Box
from oncebox.cli.app import main
from oncebox.cli.run_cmds import typed_arguments
from oncebox.kernel.errors import (
    InvalidArguments,
)

SECRET = "test-secret-not-for-production"


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
        ("dlq", "discard", "--reason", "x"),
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


def jobs_written(box: Box) -> dict[str, int]:
    return box.store.job_count_by_state().counts


def deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


def assert_refused(result: Result, code: int, *needles: str) -> str:
    """Exit `code`, no traceback, one error line (click's usage errors add their usage hint and
    one `Error:` line); returns that line."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit), result.exc_info  # nothing escaped
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if lines and lines[0].startswith("Usage:"):
        errors = [line for line in lines if line.startswith("Error:")]
        assert len(errors) == 1, result.stderr
        message = errors[0]
    else:
        assert len(lines) == 1, result.stderr
        message = lines[0]
    for needle in needles:
        assert needle in message, message
    return message


LIST_COMMANDS = [("jobs", "list"), ("dlq", "list"), ("outbox", "list"), ("audit", "list")]


@pytest.mark.parametrize("limit", ["-1", "0", "1e9", "abc", "1000000000", "", "1.5", "0x10"])
def test_a_bad_limit_is_a_usage_error_on_every_listing(cli_db, limit):
    for command in LIST_COMMANDS:
        assert_refused(invoke(*command, "--limit", limit, "--db", cli_db), 2, "'--limit'")


def test_limits_at_the_bounds_are_accepted(cli_db):
    for command in LIST_COMMANDS:
        for limit in ("1", "100000"):
            result = invoke(*command, "--limit", limit, "--db", cli_db, "--json")
            assert (result.exit_code, json.loads(result.stdout)) == (0, []), result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("frobnicate",), "No such command 'frobnicate'"),
        (("jobs", "frobnicate"), "No such command 'frobnicate'"),
        (("--frob",), "No such option '--frob'"),
        (("jobs", "list", "--frob"), "No such option '--frob'"),
        (("jobs", "list", "--limit"), "'--limit' requires an argument"),
        (("dlq", "replay", "--all", "--reason", "x", "--frob"), "No such option '--frob'"),
        (("status", "--periods", "many"), "'--periods'"),
    ],
)
def test_unknown_commands_and_flags_exit_2_without_a_traceback(args, needle):
    assert_refused(invoke(*args), 2, needle)


@pytest.mark.parametrize(
    ("db", "needle"),
    [
        ("mysql://bob:s3cret@127.0.0.1/db", "scheme 'mysql' is not supported"),
        ("http://bob:s3cret@127.0.0.1/db", "scheme 'http' is not supported"),
        ("postgresql://bob:s3cret@127.0.0.1:1/db?pool_max=many", "must be numbers"),
    ],
)
def test_a_dsn_with_a_wrong_scheme_or_option_is_a_usage_error_without_the_password(db, needle):
    for command in (("status",), ("migrate",)):
        message = assert_refused(invoke(*command, "--db", db), 2, needle)
        assert "s3cret" not in message


def pg_dsn(user: str, password: str, database: str) -> str:
    parts = psycopg.conninfo.conninfo_to_dict(PG_URL)
    host, port = parts.get("host", "127.0.0.1"), parts.get("port", 5432)
    return f"postgresql://{user}:{password}@{host}:{port}/{database}?connect_timeout=3"


@pytest.mark.postgres
def test_a_bad_password_or_user_is_a_one_line_runtime_error_that_never_echoes_it(pg_template):
    dsn = pg_dsn("oncebox_fuzz_nobody", "s3cr%40t", pg_template)
    for command in (("status",), ("migrate",), ("jobs", "list")):
        message = assert_refused(invoke(*command, "--db", dsn), 1, "***@")
        assert "s3cr" not in message


@pytest.mark.postgres
def test_a_missing_database_is_a_one_line_runtime_error(pg_template):
    user = psycopg.conninfo.conninfo_to_dict(PG_URL).get("user") or getpass.getuser()
    missing = f"oncebox_no_such_db_{uuid.uuid4().hex[:6]}"
    dsn = pg_dsn(str(user), "s3cret", missing)
    for command in (("status",), ("migrate",)):
        message = assert_refused(invoke(*command, "--db", dsn), 1, f'"{missing}" does not exist')
        assert "s3cret" not in message


@pytest.mark.parametrize(
    "db",
    [
        "postgresql://127.0.0.1:1/db?password=s3cret&connect_timeout=2",
        "host=127.0.0.1 port=1 password=s3cret dbname=db",
    ],
    ids=["query-parameter", "keyword-dsn"],
)
def test_a_password_anywhere_in_the_dsn_is_never_echoed(db):
    result = invoke("status", "--db", db)
    assert result.exit_code in (1, 2)
    assert "s3cret" not in result.output


def test_a_hostless_postgresql_url_reaches_the_server_it_names():
    result = invoke("status", "--db", "postgresql:///db?host=127.0.0.1&port=1&connect_timeout=2")
    assert_refused(result, 1, "Connection refused")


APP_SOURCE = """
from oncebox import Box

box = Box()  # reads ONCEBOX_DB


@box.task(key="note/{name}")
def note(ctx, name: str, count: int = 0, data=None) -> None:
    pass
"""


@pytest.fixture
def cli_app(tmp_path: Path, monkeypatch) -> Iterator[str]:
    """An app module under a fresh name (the in-process import cache must not hand one test
    another test's Box), with the environment a user would export; yields the database URL."""
    name = f"fuzz_app_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE)
    url = f"sqlite:///{tmp_path / 'app.db'}"
    Box(url).close()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app prepends the cwd
    monkeypatch.setenv("ONCEBOX_DB", url)  # load_app may set it: restored afterwards
    monkeypatch.setenv("ONCEBOX_APP", name)
    monkeypatch.setenv("ONCEBOX_EMAIL", "")  # recorded, so what a command sets is undone
    monkeypatch.delenv("ONCEBOX_EMAIL")
    yield url
    module = sys.modules.pop(name, None)
    if module is not None:
        module.box.close()


def jobs_in(url: str) -> dict[str, int]:
    box = Box(url)
    try:
        return jobs_written(box)
    finally:
        box.close()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("note", "name=a", "data=NaN"), "not JSON"),
        (("note", "name=a", "data=-Infinity"), "not JSON"),
        (("note", "name=a", "data=1e400"), "not JSON"),
        (("note", "name=a", "data=" + "[" * 40 + "]" * 40), "nested deeper than 32"),
        (("note", "name=a\u202eb"), "\\u202e"),
        (("note", "name=a\x1b[31mred"), "\\x1b"),
        (("note", "name=" + "x" * 10**5), "limit is 255"),
        (("note", "name={0.__class__}"), "'{'"),
        (("note", "name=%s"), "'%'"),
        (("note", "name=a", "count=1e3"), "is an int"),
        (("os.system", "command=true"), "no task named 'os.system'"),
        (("builtins.eval", "source=1"), "no task named 'builtins.eval'"),
    ],
)
def test_cli_enqueue_refuses_bad_values_on_one_line_and_writes_nothing(cli_app, args, needle):
    message = assert_refused(invoke("enqueue", *args), 2, needle)
    assert len(message) < 500 and message.isprintable()
    assert jobs_in(cli_app) == {}


@pytest.mark.parametrize(
    "args",
    [
        ("note", "name=a", "data=" + deep_json(10**4)),
        ("note", "name=a", "count=" + "1" * 5000),
        ("note", "name=\udcff"),
        ("note", "name=a", 'data={"x": 1, "x": 2}'),
    ],
    ids=["deep-json", "huge-int", "lone-surrogate", "duplicate-names"],
)
def test_cli_enqueue_refuses_hostile_values_as_usage_errors(cli_app, args):
    assert_refused(invoke("enqueue", *args), 2)
    assert jobs_in(cli_app) == {}


BAD_BYTES = "\udcff\udcfe"  # what Python makes of the bytes 0xFF 0xFE in an argument


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("jobs", "list", "--task", BAD_BYTES), "--task is not UTF-8 text: '\\xff\\xfe'"),
        (("jobs", "list", f"--queue=a{BAD_BYTES}"), "--queue is not UTF-8 text: 'a\\xff\\xfe'"),
        (("dlq", "list", "--channel", BAD_BYTES), "--channel is not UTF-8 text: '\\xff\\xfe'"),
        (("jobs", "cancel", "1", "--reason", BAD_BYTES), "--reason is not UTF-8 text"),
        (("jobs", "cancel", "1", "--reason", "x", "--actor", BAD_BYTES), "--actor is not"),
        (("jobs", "show", BAD_BYTES), "argument 3 is not UTF-8 text: '\\xff\\xfe'"),
    ],
)
def test_an_argument_that_is_not_utf8_is_a_usage_error_naming_it(cli_db, args, named):
    message = refused(invoke(*args, "--db", cli_db))
    assert message.startswith(f"oncebox: {named}"), message


def test_an_environment_value_that_is_not_utf8_is_a_usage_error_naming_it(cli_db, monkeypatch):
    monkeypatch.setenv("ONCEBOX_APP", BAD_BYTES)
    message = refused(invoke("status", "--db", cli_db))
    assert message == "oncebox: ONCEBOX_APP is not UTF-8 text: '\\xff\\xfe'"


def test_bytes_that_are_not_utf8_on_a_real_command_line_exit_2(cli_db):
    result = subprocess.run(
        [sys.executable, "-m", "oncebox.cli", "jobs", "list", "--db", cli_db, "--task", b"\xff"],
        capture_output=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == b"oncebox: --task is not UTF-8 text: '\\xff'\n"


@pytest.mark.parametrize(
    ("email", "needle"),
    [
        ("smtp://u:pw-secret@[127.0.0.1:2526", "is malformed"),
        ("smtp://127.0.0.1:99999", "is malformed"),
        ("smtp://127.0.0.1:2525?timeout=-1", "timeout"),
        ("smtp://127.0.0.1:2525?timeout=nan", "timeout"),
        ("resend+http://127.0.0.1:1/?window_hours=inf", "window_hours"),
    ],
)
def test_a_malformed_email_url_is_a_usage_error_without_its_password(cli_app, email, needle):
    message = refused(invoke("worker", "--until-idle", "--email", email))
    assert needle in message and "pw-secret" not in message, message


@pytest.mark.parametrize("timeout", ["-5", "nan", "inf", "1e400", "86401"])
def test_a_busy_timeout_out_of_range_is_refused(cli_db, timeout):
    message = refused(invoke("status", "--db", f"{cli_db}?busy_timeout={timeout}"))
    assert "busy_timeout" in message, message
