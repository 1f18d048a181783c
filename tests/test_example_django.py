"""The Django example (examples/django_bookings) on SQLite and on real PostgreSQL: its own
pytest-django tests (a view that enqueues then fails leaves no job; a hold is expired once and
its guest emailed once; a handler writing models is all-or-nothing; calls that would end the
claim's transaction are refused), and the project's commands end to end — `manage.py migrate`,
a view's enqueue, `manage.py oncebox_worker`, `oncebox_status`, a usage mistake.

Each runs in a process of its own: Django's settings are made once per process, and this
suite's other tests must not run under them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "django_bookings"
ENQUEUE = """
from django.db import transaction
from holds.models import Hold
from holds.tasks import expire_hold
from oncebox.contrib.django import box
with transaction.atomic():
    box.enqueue(expire_hold, hold_id=1)
    Hold.objects.create(id=1, guest_email="ada@example.com", nights=2)
try:
    with transaction.atomic():
        box.enqueue(expire_hold, hold_id=2)
        raise RuntimeError("the view failed after its enqueue")
except RuntimeError:
    pass
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'bookings.db'}"
    return str(request.getfixturevalue("pg_url"))


def run(
    args: list[str], database: str, tmp_path: Path, timeout: int
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "BOOKINGS_DB": database,
        "ONCEBOX_EMAIL": f"file://{tmp_path / 'outbox'}",
        "PYTHONPATH": str(EXAMPLE),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_django_example_passes_its_own_tests(database: str, tmp_path: Path):
    done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider"], database, tmp_path, 240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "\n16 passed in " in done.stdout, done.stdout[-2000:]


def test_manage_py_migrates_enqueues_works_and_reports(database: str, tmp_path: Path):
    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return run(["manage.py", *args], database, tmp_path, 120)

    migrated = manage("migrate", "--verbosity", "1")
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying oncebox.0001_schema... OK" in migrated.stdout
    enqueued = manage("shell", "--command", ENQUEUE)
    assert enqueued.returncode == 0, enqueued.stderr
    worked = manage("oncebox_worker", "--until-idle", "--settings", "bookings_site.settings")
    assert worked.returncode == 0, worked.stderr
    assert "1 completed" in worked.stdout + worked.stderr
    status = manage("oncebox_status", "--json")
    assert status.returncode == 0, status.stderr
    figures = json.loads(status.stdout)
    assert figures["schema_version"] >= 13
    assert figures["jobs"]["done"] == 1  # the failed view's job was never committed
    assert len(list((tmp_path / "outbox").glob("*.eml"))) == 1
    mistaken = manage("oncebox", "status", "--no-such-option")
    assert mistaken.returncode == 2
    assert "Traceback" not in mistaken.stderr
