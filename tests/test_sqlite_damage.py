"""A SQLite file that is not what the store expects — not a database, damaged, or replaced
under a running worker — is named with its path and the way out, in one line: never an
`sqlite3` exception leaking from the API, never a worker serving a file no longer at its path."""

from __future__ import annotations

import os
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from oncebox import Box
from oncebox.kernel.errors import SchemaError, StoreReplaced
from oncebox.store.params import JobFilter
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


def test_a_connection_opened_after_the_file_was_deleted_names_the_deletion_and_creates_nothing(
    tmp_path,
):
    """A lane's first connection can come after the deletion (a thread that had not yet opened
    one): it must not create an empty file at the path and then report missing tables — the
    cause is the deletion, and the path is left as the operator left it."""
    path = tmp_path / "freight.db"
    database_with_jobs(path, count=1)
    box = Box(f"sqlite:///{path}")
    try:
        path.unlink()
        failures: list[BaseException] = []

        def first_use_in_a_new_thread() -> None:
            try:
                box.store.job_list(JobFilter(limit=10))
            except BaseException as exc:  # the test reads what was raised
                failures.append(exc)

        thread = threading.Thread(target=first_use_in_a_new_thread)
        thread.start()
        thread.join(60)
        assert len(failures) == 1
        assert isinstance(failures[0], StoreReplaced), failures[0]
        assert f"the SQLite database {path} was deleted" in str(failures[0])
        assert not path.exists()
    finally:
        box.close()


def test_a_worker_on_a_full_disk_backs_off_says_so_and_finishes_once_there_is_room(tmp_path):
    """A full disk (every write past one byte fails, as RLIMIT_FSIZE makes it for the worker
    alone) is a store outage: the worker logs it and retries with backoff, then completes the
    jobs enqueued meanwhile, instead of dying."""
    path = tmp_path / "freight.db"
    url = f"sqlite:///{path}"
    database_with_jobs(path, count=0)
    worker = subprocess.Popen(
        [sys.executable, "-m", "oncebox.cli", "worker", "--app", "support.cli_app"],
        env={**os.environ, "ONCEBOX_DB": url, "PYTHONPATH": str(TESTS)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,  # a pipe: a log file could not grow on this "full disk" either
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN),  # noqa: PLW1509
    )
    lines: list[str] = []
    stream = worker.stderr
    assert stream is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")))
    reader.start()
    try:
        wait_until(lambda: worker_rows(url), timeout=60, what="the worker's row")
        soft, hard = resource.prlimit(worker.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(worker.pid, resource.RLIMIT_FSIZE, (1, hard))
        conn = sqlite3.connect(path, timeout=30)  # an empty log: the worker's next write grows it
        assert conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        conn.close()
        box = Box(url)
        try:

            @box.task(key="greeting/{name}")
            def greet(ctx: object, name: str) -> None: ...

            for name in ("a", "b", "c"):
                box.enqueue(greet, name=name)
        finally:
            box.close()
        wait_until(
            lambda: any("cannot write the SQLite database" in line for line in lines),
            timeout=60,
            what="the worker to say it cannot write",
        )
        assert worker.poll() is None  # still running, backing off
        resource.prlimit(worker.pid, resource.RLIMIT_FSIZE, (soft, hard))
        wait_until(lambda: done_jobs(url) == 3, timeout=90, what="the three jobs to complete")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        reader.join(30)
        stream.close()
    assert worker.returncode == 0
    text = "".join(lines)
    assert "(is its disk full, or failing?); retrying in" in text and "Traceback" not in text


def done_jobs(url: str) -> int:
    box = Box(url)
    try:
        return box.store.job_count_by_state().counts.get("done", 0)
    finally:
        box.close()
