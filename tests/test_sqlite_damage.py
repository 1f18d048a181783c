"""A SQLite file that is not what the store expects — not a database, damaged, or replaced
under a running worker — is named with its path and the way out, in one line: never an
`sqlite3` exception leaking from the API, never a worker serving a file no longer at its path."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from oncebox import Box
from oncebox.errors import SchemaError
from oncebox.store.base import JobFilter
from support.waiting import wait_until
from test_cli import TESTS, assert_one_line_error, oncebox


def database_with_jobs(path: Path, count: int = 200) -> None:
    box = Box(f"sqlite:///{path}")
    try:

        @box.task(key="greeting/{name}")
        def greet(ctx: object, name: str) -> None: ...

        box.enqueue_many(greet, [{"name": f"n{i}" * 20} for i in range(count)])
    finally:
        box.close()
    conn = sqlite3.connect(path)  # every page in the file itself, none left in the log
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def test_a_file_that_is_not_a_database_is_named_and_nothing_leaks(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("meeting notes, not a database\n" * 100)
    with pytest.raises(SchemaError, match=re.escape(f"{path} is not a SQLite database")):
        Box(f"sqlite:///{path}")
    result = oncebox("status", env={"ONCEBOX_DB": f"sqlite:///{path}"})
    assert_one_line_error(result, 1, "is not a SQLite database", str(path))
    assert "unexpected" not in result.stderr
    assert path.read_text().startswith("meeting notes")  # nothing written into it


def test_a_damaged_database_is_named_with_the_way_out(tmp_path):
    path = tmp_path / "freight.db"
    database_with_jobs(path)
    conn = sqlite3.connect(path)
    page_size, root = conn.execute(
        "SELECT (SELECT page_size FROM pragma_page_size()), rootpage FROM sqlite_master "
        "WHERE name = 'oncebox_jobs'"
    ).fetchone()
    conn.close()
    with path.open("r+b") as file:  # the jobs table's root page: the schema still reads
        file.seek(page_size * (root - 1))
        file.write(b"\xa5" * page_size)
    box = Box(f"sqlite:///{path}")
    try:
        with pytest.raises(SchemaError, match=r"is damaged .*restore it from a backup"):
            box.store.job_list(JobFilter(limit=1000))
    finally:
        box.close()
    result = oncebox("jobs", "list", env={"ONCEBOX_DB": f"sqlite:///{path}"})
    assert_one_line_error(result, 1, "is damaged", str(path))
    assert "unexpected" not in result.stderr


def worker_rows(url: str) -> int:
    box = Box(url)
    try:
        return len(box.store.worker_list(timedelta(minutes=1)))
    finally:
        box.close()


@pytest.mark.parametrize("how", ["replaced", "deleted"])
def test_a_worker_whose_database_file_is_replaced_or_deleted_stops_and_says_so(tmp_path, how):
    path = tmp_path / "freight.db"
    url = f"sqlite:///{path}"
    database_with_jobs(path, count=1)
    worker = subprocess.Popen(
        [sys.executable, "-m", "oncebox.cli", "worker", "--app", "support.cli_app"],
        env={**os.environ, "ONCEBOX_DB": url, "PYTHONPATH": str(TESTS)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: worker_rows(url), timeout=60, what="the worker's row")
        if how == "replaced":  # a restore from backup, moved into place
            backup = tmp_path / "backup.db"
            database_with_jobs(backup, count=3)
            os.replace(backup, path)
        else:
            path.unlink()
        _out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.communicate()
    assert worker.returncode == 1, err
    assert f"the SQLite database {path} was {how}" in err
    assert "Traceback" not in err
