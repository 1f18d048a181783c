"""The shipped logistics example is an app the commands accept as it is: after `oncebox demo`,
`--app oncebox.examples.logistics` opens the demo's database, with no wrapper module to write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oncebox.jobs.periods import iso_week
from oncebox.kernel.clock import real_now

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("ONCEBOX_")}
APP = ["--app", "oncebox.examples.logistics"]


def oncebox(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncebox.cli", *args],
        cwd=cwd,
        env=CLEAN,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.slow
def test_the_example_app_works_with_status_worker_and_schedule_run_after_the_demo(tmp_path):
    demo = oncebox(tmp_path, "demo", "--customers", "12", "--no-faults")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    status = oncebox(tmp_path, "status", *APP, "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["database"] == "sqlite:///oncebox-demo.db" and data["outbox"]["sent"] > 0
    period = data["schedules"][0]["periods"][0]["period"]
    rerun = oncebox(tmp_path, "schedule", "run", "weekly-digest", "--period", period, *APP)
    assert rerun.returncode == 0, rerun.stderr
    assert "0 enqueued" in rerun.stdout
    worker = oncebox(tmp_path, "worker", *APP, "--until-idle")
    assert worker.returncode == 0, worker.stdout + worker.stderr
    if iso_week(real_now()) == period:  # nothing of the demo's week is left to a worker
        assert worker.stdout.splitlines()[-1].startswith("worker stopped: 0 completed")
    else:  # a Monday 09:00-11:00: the demo ran last week, and this week fell due meanwhile
        after = json.loads(oncebox(tmp_path, "status", *APP, "--json").stdout)
        weeks = {p["period"]: p for p in after["schedules"][0]["periods"]}
        demo_week = {p["period"]: p for p in data["schedules"][0]["periods"]}[period]
        assert weeks[period] == demo_week, "a worker redid the demo's week"
        assert iso_week(real_now()) in weeks, worker.stdout


def test_importing_the_example_package_opens_no_database(tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import oncebox.examples.logistics.demo"],
        cwd=tmp_path,
        env=CLEAN,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert list(tmp_path.iterdir()) == []
