"""`oncebox sim --soak` (`make sim-soak`): worlds until stopped, a failure saved and the soak going
on, what was found summed up when it stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from oncebox.cli.app import main
from oncebox.sim.runner import run
from oncebox.sim.shrink import Case
from support.sim_breakages import settled_counted_twice


def test_a_soak_goes_on_past_a_failure_and_saves_each_case_to_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Every world that settles a job fails here (each settlement counted twice, C1): the soak
    must save each failure and go on to the end of its range, whatever seeds the worlds hold."""
    settled_counted_twice(monkeypatch)
    found = tmp_path / "found"
    args = ["--seeds", "0..7", "--found", str(found)]
    outcome = CliRunner().invoke(main, ["sim", "--soak", *args])
    assert outcome.exit_code == 1, outcome.output
    summary = json.loads((found / "summary.json").read_text())
    assert summary["worlds"] == 8 and summary["last_seed"] == 7  # on past each failure
    assert len(summary["failures"]) >= 2, outcome.output
    for failure in summary["failures"]:
        case = Case.load(Path(failure["case"]))
        again = run(case.store, record=case.record, steps=case.steps, mutation=case.mutation)
        assert again.violation is not None and again.violation.invariant == failure["invariant"]
        assert failure["invariant"] == "C1"
        assert f"seed {failure['seed']} ({case.steps} steps) FAILED" in outcome.output


def test_a_soak_that_finds_nothing_exits_0_with_its_summary(tmp_path: Path):
    found = tmp_path / "found"
    outcome = CliRunner().invoke(main, ["sim", "--soak", "--seeds", "0..5", "--found", str(found)])
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads((found / "summary.json").read_text())
    assert (summary["worlds"], summary["failures"]) == (6, [])
    assert summary["steps"] > 6 * 25  # every world ran its quiet phase too
    assert "soak stopped: 6 worlds (seeds 0..5), 0 failed" in outcome.output


def test_a_soak_stops_at_sigterm_once_the_world_under_way_has_finished(tmp_path: Path):
    found = tmp_path / "found"
    with subprocess.Popen(
        [sys.executable, "-m", "oncebox", "sim", "--soak", "--seed", "3", "--found", str(found)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as soaking:
        assert soaking.stdout is not None
        header = soaking.stdout.readline()  # written once the signals are handled
        assert "from seed 3, until stopped" in header, header
        soaking.send_signal(signal.SIGTERM)
        rest = soaking.stdout.read()
        assert soaking.wait(timeout=120) == 0, rest
    summary = json.loads((found / "summary.json").read_text())
    assert summary["first_seed"] == 3 and summary["failures"] == []
    assert f"soak stopped: {summary['worlds']} worlds" in rest
    assert "Traceback" not in rest


def test_a_soak_with_replay_or_shrink_is_a_usage_mistake(tmp_path: Path):
    outcome = CliRunner().invoke(main, ["sim", "--soak", "--shrink", "--found", str(tmp_path)])
    assert outcome.exit_code == 2, outcome.output
    assert "not with --replay or --shrink" in outcome.output and "Traceback" not in outcome.output
