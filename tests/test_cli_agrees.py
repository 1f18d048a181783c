"""The command line agrees with the library: without `--db` it uses the database `Box()` uses,
and says so once, when it creates it; the `--app` the docs give for the README's module loads
it; a worker says what it runs when it starts and what it held when it stops; `chaos --help`
names the scenarios; `plan` asks for every missing input at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from oncebox import Box
from oncebox.chaos.scenarios import SCENARIOS
from oncebox.cli.app import main
from oncebox.jobs.periods import iso_week
from oncebox.lanes.dispatcher import DispatcherResult
from oncebox.lanes.worker import WorkerResult
from support.host_clock import README_WEEK_THURSDAY, host_clock_at
from test_cli import CODE, TESTS
from test_readme import readme_example

ROOT = Path(__file__).resolve().parent.parent
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("ONCEBOX_")}


def oncebox(cwd: Path, *args: str, env: dict[str, str] | None = None):
    """A real `oncebox` in `cwd`, with no ONCEBOX_* variable unless given: as a new user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "oncebox.cli", *args],
        cwd=cwd,
        env={**CLEAN, "PYTHONPATH": os.pathsep.join([str(TESTS), str(CODE)]), **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def notice(cwd: Path) -> str:
    return (
        "no database given (--db or ONCEBOX_DB): using sqlite:///oncebox.db, a SQLite file "
        f"in {cwd}"
    )


def test_without_a_database_commands_use_the_one_box_uses_and_say_so_once(tmp_path):
    (tmp_path / "freight.py").write_text(readme_example())
    first = oncebox(tmp_path, "worker", "--app", "freight", "--until-idle")
    assert first.returncode == 0, first.stderr
    assert first.stderr.splitlines() == [notice(tmp_path)], first.stderr  # no timestamp, once
    assert (tmp_path / "oncebox.db").is_file()

    status = oncebox(tmp_path, "status")
    assert status.returncode == 0, status.stderr
    assert "database   sqlite:///oncebox.db" in status.stdout
    again = oncebox(tmp_path, "worker", "--app", "freight", "--until-idle")
    assert again.returncode == 0, again.stderr
    assert (status.stderr, again.stderr) == ("", "")  # said when it was created, not every time


@pytest.mark.parametrize("command", [["status"], ["jobs", "list"], ["dlq", "list"]])
def test_a_read_only_command_finds_no_default_database_and_creates_none(tmp_path, command):
    result = oncebox(tmp_path, *command)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.splitlines() == [
        f"oncebox: no SQLite database at {tmp_path / 'oncebox.db'} (no --db or ONCEBOX_DB "
        "given: the default is sqlite:///oncebox.db, as for Box())"
    ]
    assert list(tmp_path.iterdir()) == []


def test_migrate_without_a_database_migrates_the_default_one_and_says_so(tmp_path):
    result = oncebox(tmp_path, "migrate")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [notice(tmp_path)]
    assert "applied migration(s) 1, 2" in result.stdout
    assert (tmp_path / "oncebox.db").is_file()


def test_the_app_the_docs_name_for_the_readmes_module_loads_it(tmp_path):
    (tmp_path / "freight.py").write_text(readme_example())
    named = {
        (path.relative_to(ROOT).as_posix(), app)
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for app in re.findall(r"--app[ =](freight(?:[.:]\w+)?)\b", path.read_text())
    }
    assert ("README.md", "freight") in named, named
    failed = {}
    for where, app in sorted(named):
        result = oncebox(tmp_path, "status", "--app", app, "--db", "sqlite:///freight.db")
        if result.returncode != 0:
            failed[(where, app)] = result.stderr.strip()
    assert failed == {}


def test_a_worker_says_what_it_runs_when_it_starts(tmp_path):
    (tmp_path / "freight.py").write_text(readme_example())
    ordinary_day = host_clock_at(README_WEEK_THURSDAY, os.pathsep.join([str(TESTS), str(CODE)]))
    result = oncebox(
        tmp_path, "worker", "--app", "freight", "--until-idle", "--concurrency", "2",
        env=ordinary_day,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "worker started: sqlite:///oncebox.db · app freight · tasks weekly_digest · "
        "channels email · concurrency 2 · scheduler on"
    ), result.stdout
    assert result.stdout.splitlines()[1].startswith("worker stopped: 0 completed")


@pytest.mark.postgres
def test_a_workers_start_line_masks_the_password_and_says_the_scheduler_is_off(pg_url, tmp_path):
    db = f"{pg_url}{'&' if '?' in pg_url else '?'}password=s3cret"
    result = oncebox(
        tmp_path, "worker", "--app", "support.cli_app", "--db", db, "--until-idle",
        env={"ONCEBOX_SECRET": "cli-tests-secret-0123456789"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    start = result.stdout.splitlines()[0]
    assert start.startswith("worker started: postgresql://"), result.stdout
    assert "password=***" in start and "s3cret" not in result.stdout + result.stderr
    assert start.endswith(
        " · app support.cli_app · tasks greet · channels email · concurrency 1 · scheduler off"
    ), start


def test_the_stop_summary_counts_the_sends_held_ambiguous():
    result = WorkerResult(dispatched=DispatcherResult(sent=3, ambiguous=2))
    assert str(result) == (
        "worker stopped: 0 completed, 0 duplicate(s) absorbed, 0 retried, 0 dead; "
        "3 message(s) sent, 2 held (ambiguous)"
    )


def test_chaos_help_names_every_scenario():
    result = CliRunner().invoke(main, ["chaos", "--help"])
    assert result.exit_code == 0, result.output
    words = set(re.findall(r"[\w.-]+", result.output))
    assert [name for name in SCENARIOS if name not in words] == [], result.output


def test_the_command_line_starts_without_the_chaos_scenarios():
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, oncebox.cli.app; print(sorted(sys.modules))"],
        env={**CLEAN, "PYTHONPATH": str(CODE)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert "'oncebox.chaos.scenarios'" not in probe.stdout


def test_plan_asks_for_every_missing_input_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    box = Box(url)
    try:

        @box.task(key="weekly-digest/customer-{customer_id}/{period}")
        def weekly_digest(ctx, customer_id: int, period: str) -> None:
            pass

        @box.schedule("weekly-digest", cron="0 9 * * MON", period=iso_week, task=weekly_digest)
        def active_customers(ctx):  # the README's schedule: no SLO
            return []

        box.ticker().run_once()  # the database knows the schedule; no scan has finished
    finally:
        box.close()
    result = oncebox(tmp_path, "plan", "--db", url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert "--eligible" in line and "--window" in line, line
    given = oncebox(tmp_path, "plan", "--db", url, "--eligible", "300")
    assert given.returncode == 2 and "--eligible" not in given.stderr, given.stderr
    assert "--window" in given.stderr
