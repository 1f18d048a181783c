"""bench/storage.py (issue 47's figures: WAL, server CPU, row and index writes per job) runs at
its tiny size on a private PostgreSQL cluster and reports every figure with a sane value. Speed
is not asserted: these are counts the schema decides (rows written per job, HOT updates), and
bounds any run must meet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = os.environ.get("CI", "").lower() == "true"  # where the private cluster must not skip
RUNS = ("noop", "full", "floor_full", "floor_noop")


def run_tiny(out: Path) -> dict[str, Any]:
    """bench/storage.py at its tiny size, every mode, in its own process (as a user runs it)."""
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "storage.py"),
            *("--size", "tiny", "--per-job", "--backlog", "--prune", "--json", str(out)),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0 and "no private cluster" in result.stderr and not CI:
        pytest.skip(
            f"!!! SKIPPING: no private PostgreSQL cluster here: {result.stderr.strip()} !!!"
        )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.mark.slow
def test_the_storage_benchmark_reports_per_job_backlog_and_prune_figures_without_autovacuum(
    tmp_path,
):
    figures = run_tiny(tmp_path / "storage.json")
    assert figures["cluster"]["autovacuum"] == "off", figures["cluster"]
    per_job = figures["per_job"]
    for name in RUNS:
        run = per_job[name]
        assert run["jobs"] == figures["jobs"] == 300, run
        # every processed job writes WAL, and the load's WAL is not counted in the phase's
        assert run["wal_bytes"] > 0 and run["enqueue_wal_bytes"] > 0, (name, run)
        assert run["server_cpu_us"] >= 0 and run["statement_us"] > 0, (name, run)
        assert run["index_entries"] > 0, (name, run["index_entries_by_index"])
        assert run["checkpoints_in_phase"] == 0, (name, run)
        assert 0 <= run["jobs_hot_pct"] <= 100, (name, run["tables"])
        for table, t in run["tables"].items():
            assert t["hot_pct"] is None or 0 <= t["hot_pct"] <= 100, (name, table, t)
            assert t["n_tup_hot_upd"] <= t["n_tup_upd"], (name, table, t)
    # each job's row is updated by its lease and its settlement, whatever the schema calls them
    assert per_job["floor_full"]["tables"]["jobs"]["n_tup_upd"] == 2, per_job["floor_full"]
    assert 0 <= per_job["full"]["outbox_hot_pct"] <= 100, per_job["full"]["tables"]
    for pair in ("full/floor_full", "noop/floor_noop"):
        assert per_job["ratios"][pair]["wal_bytes"] > 0, per_job["ratios"]
    backlog = figures["backlog"]
    assert backlog["small_per_s"] > 0 and backlog["large_per_s"] > 0, backlog
    assert backlog["large"] > backlog["small"], backlog
    prune = figures["prune"]
    # retention by week: the first week goes, by batches on one database, whole on the other
    assert prune["pruned"] == prune["jobs_per_week"] == 300, prune
    assert prune["left"] == 300, prune  # the second week is kept
    assert prune["delete_s"] > 0 and prune["vacuum_s"] > 0, prune
    drop = prune["drop"]
    assert (drop["rows"], drop["dropped"], drop["left"]) == (300, 300, 300), drop
    assert drop["partition"].endswith("oncebox_job_history_20261005"), drop
    assert drop["partition_gone"], drop
    assert drop["drop_s"] > 0 and prune["drop_over_delete_and_vacuum"] > 0, prune
