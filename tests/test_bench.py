"""The benchmark harness runs (at its smallest size) so it cannot rot. Speed is not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI = os.environ.get("CI", "").lower() == "true"  # where an optional part must not skip


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A bench/ script at its smallest size, as a user runs it (its own process)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_the_core_benchmark_runs_and_reports_every_row(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "core.json"
    result = run_bench(
        "core.py",
        "--jobs",
        "200",
        "--repeat",
        "1",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["store"], r["jobs"]) for r in rows] == [
        ("sqlite", "keyed"),
        ("sqlite", "keyless"),
        ("postgres", "keyed"),
        ("postgres", "keyless"),
    ]
    assert all(r["enqueue"] > 0 and r["process"] > 0 for r in rows)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_outbox_benchmark_runs_and_reports_every_row(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "outbox.json"
    result = run_bench(
        "outbox.py",
        "--jobs",
        "100",
        "--smtp-jobs",
        "10",
        "--repeat",
        "1",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["store"], r["workload"]) for r in rows] == [
        (store, workload)
        for store in ("sqlite", "postgres")
        for workload in ("dispatch/null", "dispatch/smtp", "full path")
    ]
    assert all(r["per_s"] > 0 for r in rows)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_fan_out_benchmark_runs_and_reports_both_stores(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "fanout.json"
    result = run_bench(
        "fanout.py",
        "--postgres-customers",
        "300",
        "--sqlite-customers",
        "300",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["store"], r["customers"]) for r in rows] == [("sqlite", 300), ("postgres", 300)]


def test_the_full_chaos_run_runs_at_its_smallest_size(tmp_path):
    """bench/chaos.py (all scenarios + soak, both stores, several seeds) at one scenario, one
    seed, SQLite only: the script works; the scenarios themselves are tests/test_chaos.py's."""
    out = tmp_path / "chaos.json"
    result = run_bench(
        "chaos.py",
        "--scenario",
        "manual-rerun",
        "--no-soak",
        "--customers",
        "20",
        "--seeds",
        "1",
        "--postgres",
        "",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert [(r["store"], r["scenario"], r["ok"]) for r in report["rows"]] == [
        ("sqlite", "manual-rerun", True)
    ]
    assert "1 of 1 runs held" in result.stdout


@pytest.mark.postgres
@pytest.mark.slow
def test_the_comparison_runs_every_workload_at_its_smallest_size_and_checks_every_target(
    pg_template, tmp_path
):
    """bench/compare.py at its tiny size, without peers (the suite never installs them): every
    workload produces its figures and every target of the issue is read from them; speed is not
    asserted — a target not met is a figure, not a failure."""
    from conftest import PG_URL
    from support.brokers import AMQP_URL, reachable

    out = tmp_path / "latest.json"
    # the file it replaces was labelled superseded (bench/results/latest.json)
    out.write_text(json.dumps({"superseded": "an older run's label", "size": {}}))
    amqp = reachable(AMQP_URL)  # the broker-held row: the machine's RabbitMQ
    result = run_bench(
        "compare.py",
        "--size",
        "tiny",
        "--peers",
        "--postgres",
        PG_URL,
        "--amqp",
        amqp,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert "superseded" not in figures  # written afresh, not merged into the old file
    systems = figures["throughput"]["systems"]
    assert list(systems) == [
        "oncebox keyed",
        "oncebox keyless",
        "oncebox keyed, stale statistics",
        "oncebox keyed (SQLite)",
        "oncebox keyed via RabbitMQ",
    ]
    assert all(row["process"] > 0 and row["enqueue"] > 0 for row in systems.values())
    full = figures["throughput"]["full_path"]
    assert full["oncebox_full_per_s"] > 0 and full["full_per_s"] > 0
    # the split of the gap: oncebox's own statements from the floor's minimal script, and two
    # consumer lanes
    assert full["ours_per_s"] > 0 and full["oncebox_full_2_consumers_per_s"] > 0
    # ratios of two workloads come from the same rounds; without peers, only the floor's
    assert set(figures["throughput"]["ratios"]) == {
        "bulk enqueue ÷ COPY",
        "full path ÷ floor's full path",
        "no-op keyed via RabbitMQ ÷ table",
    }
    counts = {name: row["count"] for name, row in figures["latency"].items()}
    assert counts == {  # every job of the 1 s window at its rate
        "oncebox (PostgreSQL) 200/s": 200,
        "oncebox (PostgreSQL) 20/s": 20,
        "oncebox (SQLite) 200/s": 200,
    }
    assert figures["backlog"]["oncebox"]["small_per_s"] > 0
    assert figures["fanout"]["customers"] == 500
    assert figures["idle"]["seconds"] == figures["idle_sqlite"]["seconds"] == 1
    measured = {t["target"]: t["measured"] for t in figures["targets"]}
    assert len(measured) == 14
    # without peers, only the ratios against a peer are missing
    assert [name for name, value in measured.items() if value is None] == [
        "no-op processing ÷ pgqueuer's",
        "full guarantee path ÷ pgqueuer's no-op",
        "pick-up p50 at 200/s ÷ pgqueuer's",
        "pick-up p99 at 200/s ÷ pgqueuer's",
        "pick-up p50 at 20/s ÷ pgqueuer's",
        "pick-up p99 at 20/s ÷ pgqueuer's",
    ]
    assert "targets" in result.stdout and "not measured" in result.stdout


@pytest.mark.postgres
def test_the_idle_query_rate_benchmark_runs_at_its_smallest_size(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "idle.json"
    result = run_bench(
        "idle.py",
        "--seconds",
        "1",
        "--warmup",
        "1",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["seconds"] == 1
    # the worker's own count stays as detail, whoever counts the headline
    assert sum(figures["by_statement"].values()) == figures["worker_transactions"]
    assert figures["worker_per_s"] == figures["worker_transactions"]
    if figures["fallback"] is None:  # a private cluster counted the statements: the headline
        assert figures["counted_by"] == "pg_stat_statements"
        assert sum(figures["statements_by_query"].values()) == figures["statements"]
        assert figures["per_s"] == figures["statements"]
        assert "statements in 1 s = " in result.stdout
    else:  # no private cluster here: the worker's count, said loudly
        assert figures["counted_by"] == "worker"
        assert figures["per_s"] == figures["worker_transactions"]
        assert "NOT COUNTED BY THE SERVER" in result.stdout
    assert "transactions in 1 s" in result.stdout


@pytest.mark.slow
def test_the_sqlite_contention_benchmark_runs_and_no_enqueue_or_lease_is_lost(tmp_path):
    out = tmp_path / "contention.json"
    result = run_bench(
        "sqlite_contention.py",
        "--jobs",
        "40",
        "--enqueues",
        "20",
        "--writers",
        "4",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    shared = figures["contended"]
    assert (shared["enqueued"], shared["failed"]) == (20, 0), shared["failure"]
    assert figures["alone"]["leases_expired"] == shared["leases_expired"] == 0
    assert shared["completed"] == figures["alone"]["completed"] == 40


@pytest.mark.postgres
@pytest.mark.slow
def test_the_scrape_benchmark_runs_and_names_what_a_scrape_costs(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "scrape.json"
    result = run_bench(
        "scrape.py", "--sizes", "200", "--repeat", "1", "--postgres", PG_URL, "--json", str(out)
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["store"], r["jobs"]) for r in rows] == [("sqlite", 200), ("postgres", 200)]
    assert all(r["top"] and r["store_ms"] <= r["scrape_ms"] for r in rows)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_intents_benchmark_loads_a_year_of_intents_and_measures_the_claim_beside_them(
    pg_template, tmp_path
):
    from conftest import PG_URL

    out = tmp_path / "intents.json"
    result = run_bench(
        "intents.py",
        "--intents",
        "0",
        "3000",
        "--measure",
        "100",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    rows = figures["rows"]
    # the load is there, beside the measured jobs' own intents
    assert [(r["intents"], r["rows"]) for r in rows] == [(0, 100), (3000, 3100)]
    assert all(r["process_per_s"] > 0 and r["index_bytes"] > 0 for r in rows)
    assert figures["flat"] == rows[1]["process_per_s"] / rows[0]["process_per_s"]


@pytest.mark.postgres
@pytest.mark.slow
def test_the_retention_benchmark_prunes_its_backlog_while_a_worker_works(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "retention.json"
    result = run_bench(
        "retention.py",
        "--rows",
        "3000",
        "--measure",
        "100",
        "--rounds",
        "1",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    # every loaded job and message was past its retention, and went
    assert (figures["pruned"]["jobs"], figures["pruned"]["messages"]) == (1500, 1500)
    sizes = figures["sizes"]
    assert sizes["before"]["oncebox_outbox"]["rows"] == 1500
    assert sizes["after_prune"]["oncebox_outbox"]["rows"] == 0
    assert sizes["after_prune"]["oncebox_delivery_attempts"]["rows"] == 0
    assert figures["baseline_per_s"] > 0 and figures["during_per_s"] > 0
    row = figures["message_row_bytes"]
    assert row["with_payload"] > row["without_payload"] > 0


@pytest.mark.slow
def test_the_statements_benchmark_names_oncebox_statements_and_splits_the_full_path(tmp_path):
    out = tmp_path / "statements.json"
    result = run_bench("statements.py", "--jobs", "200", "--json", str(out))
    if result.returncode != 0 and "no private cluster" in result.stderr and not CI:
        pytest.skip(
            f"!!! SKIPPING: no private PostgreSQL cluster here: {result.stderr.strip()} !!!"
        )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["jobs"] == 200
    ours = {s["statement"]: s for s in figures["oncebox's SQL"]["statements"]}
    worker = {s["statement"]: s for s in figures["oncebox's worker"]["statements"]}
    path = {"job_lease", "intent_claim", "outbox_insert", "job_finish"}
    path |= {"outbox_lease", "outbox_finish"}
    # every statement of the path is named as in store/sql/postgres/, each row counted once
    assert path <= set(ours) and path <= set(worker), (sorted(ours), sorted(worker))
    assert all(ours[name]["rows"] == 200 for name in path), ours
    assert all(worker[name]["rows"] == 200 for name in path), worker
    assert len(figures["the floor's SQL"]["statements"]) == 5
    assert all(f["us_per_job"] > 0 for k, f in figures.items() if k != "jobs")


@pytest.mark.postgres
@pytest.mark.slow
def test_the_console_benchmark_renders_every_page_over_its_backlog(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "console.json"
    result = run_bench(
        "console.py",
        "--backlog",
        "200",
        "--requests",
        "2",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["backlog"] == 200
    assert {"overview", "dead letters", "a key's receipt chain"} <= set(figures["pages"])
    assert all(0 < page["p50_ms"] <= page["p95_ms"] for page in figures["pages"].values())
    assert "worst p95" in result.stdout


@pytest.mark.postgres
@pytest.mark.slow
def test_the_limits_benchmark_reports_each_cost_beside_the_peer(pg_template, tmp_path):
    from conftest import PG_URL

    out = tmp_path / "limits.json"
    result = run_bench(
        "limits.py",
        "--waiting",
        "500",
        "--partitions",
        "5",
        "--measure",
        "100",
        "--rounds",
        "1",
        "--peers",
        "--postgres",
        PG_URL,
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["beside"]["alone"] > 0 and figures["beside"]["beside"] > 0
    assert set(figures["blocked_lease_ms"]) == {"5"}
    per_job = figures["per_job"]
    assert all(per_job[k] > 0 for k in ("unlimited", "concurrency", "rate"))
    assert figures["pgqueuer"] is None  # --peers with none named: oncebox alone


@pytest.mark.postgres
@pytest.mark.slow
def test_the_brokers_benchmark_drains_each_transport_beside_the_table_queue(pg_template, tmp_path):
    from conftest import PG_URL
    from support.brokers import AMQP_URL, NATS_URL, reachable

    out = tmp_path / "brokers.json"
    reachable(AMQP_URL)
    result = run_bench(
        "brokers.py",
        *("--jobs", "200", "--rounds", "1", "--postgres", PG_URL, "--amqp", AMQP_URL),
        *("--nats", reachable(NATS_URL), "--json", str(out)),
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    assert figures["table"] > 0 and figures["rabbitmq"] > 0 and figures["relayed"] > 0
    assert figures["nats_relayed"] < min(figures["nats_relay"], figures["nats_relayed_consume"])
    assert figures["ratio"] == pytest.approx(figures["rabbitmq"] / figures["table"], rel=0.01)
    assert figures["relayed_ratio"] == pytest.approx(
        figures["relayed"] / figures["table"], rel=0.01
    )
    # end to end is over the relay and the lane, each slower than the whole
    assert figures["relayed"] < min(figures["relay"], figures["relayed_consume"])


@pytest.mark.postgres
@pytest.mark.slow
def test_the_dedupe_benchmark_splits_each_second_copy_between_broker_and_key(pg_template, tmp_path):
    """Within JetStream's window (made 2 s here) and SQS FIFO's five minutes the broker drops
    the copy; past it, and on brokers without dedupe, the key absorbs it; no job ran twice."""
    from conftest import PG_URL
    from support.brokers import AMQP_URL, NATS_URL, reachable

    out = tmp_path / "dedupe.json"
    nats = f"{reachable(NATS_URL)}?duplicates=2"
    result = run_bench(
        "dedupe.py",
        *("--jobs", "3", "--gaps", "0.2,3", "--poll", "0.2", "--postgres", PG_URL),
        *("--amqp", reachable(AMQP_URL), "--nats", nats, "--json", str(out)),
    )
    assert result.returncode == 0, result.stderr
    removed = {
        (r["broker"], r["gap"]): r["removed_share"] for r in json.loads(out.read_text())["rows"]
    }
    assert removed == {
        **{("rabbitmq", gap): 0.0 for gap in ("0.2", "3", "redrive")},
        **{("sqs-standard", gap): 0.0 for gap in ("0.2", "3", "redrive")},
        **{("sqs-fifo", gap): 1.0 for gap in ("0.2", "3", "redrive")},
        ("nats", "0.2"): 1.0,
        ("nats", "3"): 0.0,
        ("nats", "redrive"): 0.0,
    }
