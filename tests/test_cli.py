"""The command line, as a user runs it: a real process, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import oncebox as package_under_test
from oncebox import Box, Retry
from oncebox.store.sqlfiles import load_migrations
from oncebox.testing import drain
from support.rows import job_row

TESTS = Path(__file__).resolve().parent
#: The folder holding the oncebox these tests import: the command runs that same code (a
#: checkout's own `src` given on PYTHONPATH, not only the one the virtualenv installed).
CODE = Path(package_under_test.__file__ or "").resolve().parent.parent


def oncebox(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(CODE)])}
    full_env.pop("ONCEBOX_DB", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "oncebox.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=120,
    )


def assert_one_line_error(result, code: int, *needles: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 or result.stderr.startswith("Usage:"), result.stderr
    for needle in needles:
        assert needle in result.stderr


def dead_greeting(url: str) -> int:
    box = Box(url)
    try:

        @box.task(key="greeting/{name}", retry=Retry(max_attempts=1))
        def greet(ctx, name: str) -> None:
            raise ValueError("cannot greet poison")

        job = box.enqueue(greet, name="poison").job_id
        drain(box, raise_on_failure=False)
        assert job is not None
        return job
    finally:
        box.close()


def test_migrate_applies_then_reports_up_to_date(store_url):
    url = store_url if store_url.startswith("sqlite") else f"{store_url}?schema=cli_migrate"
    if url.startswith("sqlite"):
        Path(url.removeprefix("sqlite:///")).unlink(missing_ok=True)
    first = oncebox("migrate", "--db", url)
    assert first.returncode == 0, first.stderr
    latest = len(load_migrations("sqlite" if url.startswith("sqlite") else "postgres"))
    assert f"applied migration(s) {', '.join(map(str, range(1, latest + 1)))}" in first.stdout
    again = oncebox("migrate", env={"ONCEBOX_DB": url})
    assert again.returncode == 0 and f"schema is up to date (version {latest})" in again.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["migrate", "--db", "mysql://localhost/x"], "scheme 'mysql' is not supported"),
        (["migrate", "--db", "not a url"], "is not a URL"),
        (["migrate", "--db", "sqlite:///:memory:"], "needs a file path"),
        (["migrate", "--db", "sqlite:///x.db?sync=off"], "unknown SQLite URL option"),
        (["worker"], "--app MODULE is required"),
        (["worker", "--app", "no_such_module", "--db", "sqlite:///x.db"], "cannot import"),
        (["worker", "--app", "support.db", "--db", "sqlite:///x.db"], "holds no oncebox.Box"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args, needle, tmp_path):
    assert_one_line_error(oncebox(*args, cwd=tmp_path), 2, needle)


def test_click_usage_errors_exit_2(tmp_path):
    assert oncebox("no-such-command", cwd=tmp_path).returncode == 2
    assert oncebox("dlq", "replay", "greeting/x", cwd=tmp_path).returncode == 2  # no --reason


def test_an_unreachable_database_is_a_one_line_runtime_error_without_the_password(tmp_path):
    result = oncebox(
        "migrate", "--db", "postgresql://bob:s3cret@127.0.0.1:1/db?connect_timeout=2", cwd=tmp_path
    )
    assert_one_line_error(result, 1, "PostgreSQL at postgresql://bob:***@127.0.0.1:1/db")
    assert "s3cret" not in result.stderr


def test_worker_until_idle_runs_the_apps_jobs(store_url, tmp_path):
    box = Box(store_url)

    @box.task(key="greeting/{name}")
    def greet(ctx, name: str) -> None:
        pass

    for name in ("ada", "grace", "ada"):
        box.enqueue(greet, name=name)
    box.close()
    result = oncebox(
        "worker",
        "--app",
        "support.cli_app",
        "--db",
        store_url,
        "--until-idle",
        "--concurrency",
        "2",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "2 completed" in result.stdout


def test_worker_refuses_a_bad_concurrency(tmp_path):
    result = oncebox("worker", "--app", "support.cli_app", "--concurrency", "0", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_dlq_replay_keeps_the_key_and_is_audited(store_url, tmp_path):
    job = dead_greeting(store_url)
    result = oncebox(
        "dlq",
        "replay",
        "greeting/poison",
        "--reason",
        "fixed upstream",
        "--actor",
        "ops-anna",
        "--db",
        store_url,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert f"job {job} (greeting/poison) is ready again" in result.stdout
    box = Box(store_url)
    try:
        row = job_row(box, job)
        assert (row.state, row.key) == ("ready", "greeting/poison")
        audit = box.store.audit_list(target_id=job)
        assert [(a.action, a.actor, a.reason) for a in audit] == [
            ("replay", "ops-anna", "fixed upstream")
        ]
    finally:
        box.close()


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("greeting/nobody", "no job or outbox row with id or key 'greeting/nobody'"),
        ("greeting//bad", "invalid key"),
        ("999999", "no job with id or key '999999'"),
    ],
)
def test_dlq_replay_of_a_missing_or_bad_key_is_a_usage_error(store_url, tmp_path, target, needle):
    dead_greeting(store_url)
    result = oncebox("dlq", "replay", target, "--reason", "x", "--db", store_url, cwd=tmp_path)
    assert_one_line_error(result, 2, needle)


def test_jobs_show_prints_the_job_and_its_attempts_as_json(store_url, tmp_path):
    job = dead_greeting(store_url)
    result = oncebox("jobs", "show", str(job), "--json", "--db", store_url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [record] = json.loads(result.stdout)
    assert (record["id"], record["key"], record["state"]) == (job, "greeting/poison", "dead")
    assert [a["outcome"] for a in record["attempts"]] == ["dead"]
    assert "cannot greet poison" in record["attempts"][0]["error"]


def test_the_demo_runs_end_to_end_and_exits_0(tmp_path):
    result = oncebox("demo", "--customers", "30", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fault injected: a worker SIGKILLed" in result.stdout
    assert "20 at the claim" in result.stdout
    assert (tmp_path / "oncebox-demo.db").exists()
    assert len(list((tmp_path / "oncebox-demo-outbox").glob("*.eml"))) > 20


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--period", "2026-W60"), "--period"),
        (("--customers", "2"), "--customers"),
        (("--customers", "many"), "--customers"),
    ],
)
def test_the_demo_refuses_bad_arguments_with_a_usage_error(tmp_path, args, needle):
    result = oncebox("demo", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert needle in result.stderr
    assert not (tmp_path / "oncebox-demo.db").exists()


def test_the_demo_refuses_a_database_that_already_holds_jobs_and_writes_nothing(tmp_path):
    import sqlite3

    url = f"sqlite:///{tmp_path / 'app.db'}"
    dead_greeting(url)

    def snapshot() -> tuple[list[str], list[tuple[str, str]]]:
        conn = sqlite3.connect(tmp_path / "app.db")
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master ORDER BY 1")]
            settings = conn.execute("SELECT name, value FROM oncebox_settings").fetchall()
            return tables, settings
        finally:
            conn.close()

    before = snapshot()
    result = oncebox("demo", "--db", url, cwd=tmp_path)
    assert_one_line_error(result, 2, "needs a database of its own")
    assert snapshot() == before
    assert not (tmp_path / "app.db.clock").exists()


@pytest.mark.postgres
def test_the_demo_runs_on_postgresql(pg_url, tmp_path):
    result = oncebox("demo", "--db", pg_url, "--customers", "30", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "invariants hold" in result.stdout
