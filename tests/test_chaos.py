"""The chaos harness: the CI set holds on both stores, every mutation makes its named scenario
fail (a harness that cannot fail proves nothing), and the harness cleans up after itself."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from conftest import PG_URL as PG_SERVER
from oncebox.chaos import SCENARIOS, run_scenario, run_selected, workspace
from oncebox.chaos.history import HistoryWriter, read_history, send_outcomes
from oncebox.chaos.mutations import MUTATIONS
from oncebox.chaos.report import select
from oncebox.chaos.runner import SPAWN
from oncebox.chaos.workload import Gate
from oncebox.cli.app import main
from support.brokers import AMQP_URL, NATS_URL, nats_server_installed, reachable
from support.procs import stop_in_a_lane_thread
from support.waiting import wait_until

CUSTOMERS = 40


def ci_set(store: str) -> list[str]:
    return [s.name for s in select("ci", store, allow_server_restart=False)]  # type: ignore[arg-type]


# One test per scenario: each is bounded by the per-test timeout on its own, so a slow loaded
# machine cannot fail the whole set under one limit while every scenario it finished held.
@pytest.mark.parametrize("name", ci_set("sqlite"))
def test_each_ci_scenario_holds_on_sqlite(name):
    result = run_scenario(SCENARIOS[name], server=None, customers=CUSTOMERS, seed=7)
    assert result.ok, [f"{v.invariant}: {v.key}: {v.evidence}" for v in result.violations]


@pytest.mark.postgres
@pytest.mark.parametrize("name", ci_set("postgres"))
def test_each_ci_scenario_holds_on_postgres(pg_template, name, monkeypatch):
    if SCENARIOS[name].broker == "rabbitmq":  # the machine's: skipped loudly outside CI
        monkeypatch.setenv("ONCEBOX_CHAOS_AMQP", reachable(AMQP_URL))
    if SCENARIOS[name].broker == "nats":
        monkeypatch.setenv("ONCEBOX_CHAOS_NATS", reachable(NATS_URL))
    result = run_scenario(SCENARIOS[name], server=PG_SERVER, customers=CUSTOMERS, seed=7)
    assert result.ok, [f"{v.invariant}: {v.key}: {v.evidence}" for v in result.violations]


def test_the_ci_set_is_every_scenario_but_the_soak_and_the_server_restart():
    assert {"connection-drops", "sigstop-past-lease"} <= set(ci_set("postgres"))
    assert "broker-kill-consumer.committed" in ci_set("postgres")
    assert {"sqs-kill-consumer.committed", "nats-kill-consumer.committed"} <= set(
        ci_set("postgres")
    )
    assert not any(name.startswith(("broker-", "sqs-", "nats-")) for name in ci_set("sqlite"))
    assert "soak" not in ci_set("sqlite") and "server-restart" not in ci_set("postgres")


def test_a_set_run_prints_its_summary(capsys):
    results = run_selected("manual-rerun", server=None, customers=20, seed=7)
    assert [r.ok for r in results] == [True]
    assert "manual-rerun · sqlite" in capsys.readouterr().out


@pytest.mark.parametrize(
    "mutation",
    sorted(m for m, v in MUTATIONS.items() if "sqlite" in v.stores and not v.caught_by_test),
)
def test_each_mutation_makes_its_named_scenario_fail_on_sqlite(mutation):
    scenario = SCENARIOS[MUTATIONS[mutation].must_fail]
    result = run_scenario(scenario, server=None, customers=CUSTOMERS, seed=3, mutations=(mutation,))
    assert not result.ok, f"{mutation} went unnoticed by {scenario.name}"
    assert f"--mutation {mutation}" in result.rerun(None)


# On PostgreSQL: the concurrency mutations, and those whose scenario takes another route there
# (a deferred constraint, a nested comment, a server restart, the bucket's clock).
ON_POSTGRES = [
    "no-lease-fence",
    "no-unique-index",
    "ack-before-commit",
    "release-refused-batch",
    "no-guard",
    "strand-on-outage",
    "bucket-time-back",
    "stale-given-back",  # a broker-held queue's: PostgreSQL only
]


@pytest.mark.postgres
@pytest.mark.parametrize("mutation", ON_POSTGRES)
def test_each_mutation_that_differs_on_postgres_fails_there_too(pg_template, mutation, monkeypatch):
    scenario = SCENARIOS[MUTATIONS[mutation].must_fail]
    if scenario.broker == "rabbitmq":
        monkeypatch.setenv("ONCEBOX_CHAOS_AMQP", reachable(AMQP_URL))
    result = run_scenario(
        scenario, server=PG_SERVER, customers=CUSTOMERS, seed=3, mutations=(mutation,)
    )
    assert not result.ok, f"{mutation} went unnoticed by {scenario.name}"


@pytest.mark.parametrize("mutation", sorted(m for m, v in MUTATIONS.items() if v.caught_by_test))
def test_each_mutation_a_test_catches_names_a_test_that_runs_it(mutation):
    """A mutation caught by a test, not a scenario: the test exists and switches it on
    (`mutated("<name>")`), so removing the fence it stands for fails that test."""
    path, _, test = MUTATIONS[mutation].must_fail.partition("::")
    source = (Path(__file__).parent.parent / path).read_text("utf-8")
    start = source.find(f"def {test}(")
    assert start >= 0, f"{mutation}: no test {test} in {path}"
    body = source[start : source.find("\ndef ", start + 1)]
    assert f'mutated("{mutation}")' in body, f"{mutation}: {test} does not switch it on"


@pytest.mark.postgres
def test_a_run_creates_its_own_database_and_drops_it(pg_template, monkeypatch):
    def chaos_databases() -> set[str]:
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'oncebox_chaos_%'"
            ).fetchall()
        return {r[0] for r in rows}

    # its own name, known in advance: other runs on the same server (a second suite, a person)
    # may create and drop theirs meanwhile, so the test looks only at this run's database
    fixed = uuid.uuid4()
    monkeypatch.setattr("oncebox.chaos.workspace.uuid.uuid4", lambda: fixed)
    name = f"oncebox_chaos_{fixed.hex[:12]}"
    created: list[str] = []
    admin = workspace._admin

    def recording(server: str, conninfo: str, statement: str, doing: str) -> None:
        created.append(statement)
        admin(server, conninfo, statement, doing)

    monkeypatch.setattr(workspace, "_admin", recording)
    assert name not in chaos_databases()
    result = run_scenario(SCENARIOS["manual-rerun"], server=PG_SERVER, customers=20, seed=1)
    assert result.ok and result.store == "postgres"
    assert created[0] == f'CREATE DATABASE "{name}"'
    assert name not in chaos_databases()


def test_the_command_prints_json_and_exits_0_when_the_scenario_holds():
    outcome = CliRunner().invoke(
        main, ["chaos", "--scenario", "manual-rerun", "--customers", "20", "--json"]
    )
    assert outcome.exit_code == 0, outcome.output
    [result] = json.loads(outcome.output)
    assert result["scenario"] == "manual-rerun" and result["ok"] is True
    assert result["eligible"] > 0 and result["delivered"] == result["eligible"] - 1  # the poison
    assert result["violations"] == []


def test_the_command_exits_1_with_evidence_and_the_rerun_line_on_a_violation():
    outcome = CliRunner().invoke(
        main,
        ["chaos", "--scenario", "iso-week-boundary", "--customers", "20", "--seed", "5",
         "--mutation", "period-%Y"],
    )  # fmt: skip
    assert outcome.exit_code == 1
    assert "VIOLATION P1 periods are ISO weeks: weekly-digest/2025-W01" in outcome.output
    assert "run it again: oncebox chaos --scenario iso-week-boundary --seed 5" in outcome.output


def test_a_mutation_a_test_catches_is_named_with_that_test():
    """No scenario opens the race such a mutation reopens: the command says which test does."""
    outcome = CliRunner().invoke(
        main,
        ["chaos", "--scenario", "manual-rerun", "--customers", "20", "--mutation",
         "prune-taken-over"],
    )  # fmt: skip
    assert "note: prune-taken-over is caught by a test, not a scenario: pytest " in outcome.output
    assert MUTATIONS["prune-taken-over"].must_fail in outcome.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "no-such-scenario"], "unknown scenario 'no-such-scenario'"),
        (["--customers", "3"], "--customers"),
        (["--mutation", "no-such-mutation", "--scenario", "manual-rerun"], "unknown mutation"),
        (["--db", "mysql://x/y", "--scenario", "manual-rerun"], "not supported"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message):
    outcome = CliRunner().invoke(main, ["chaos", *args])
    assert outcome.exit_code == 2, outcome.output
    assert message in outcome.output
    assert "Traceback" not in outcome.output


def test_an_unreachable_server_is_a_runtime_failure_exit_1():
    outcome = CliRunner().invoke(
        main, ["chaos", "--scenario", "manual-rerun", "--db", "postgresql://127.0.0.1:1/x"]
    )
    assert outcome.exit_code == 1
    assert "cannot reach PostgreSQL at postgresql://127.0.0.1:1/x" in outcome.output
    assert len(outcome.output.strip().splitlines()) == 1


def test_a_send_without_a_recorded_outcome_counts_as_unknown(tmp_path: Path):
    writer = HistoryWriter(tmp_path, "w1", seed=1)
    writer.write("send", "invoke", "tok-a")
    writer.write("send", "ok", "tok-a")
    writer.write("send", "invoke", "tok-b")  # killed here: no outcome
    writer.write("send", "invoke", "tok-c")
    writer.write("send", "unknown", "tok-c", "timeout after DATA")
    writer.close()
    with (tmp_path / "history-99.jsonl").open("w") as torn:
        torn.write('{"op": "send", "phase": "inv')  # a process killed mid-line
    outcomes = send_outcomes(read_history(tmp_path))
    assert outcomes.invoked == {"tok-a": 1, "tok-b": 1, "tok-c": 1}
    assert outcomes.unknown == {"tok-b": 1, "tok-c": 1}


def test_a_scenario_that_restarts_the_server_needs_the_flag():
    outcome = CliRunner().invoke(main, ["chaos", "--scenario", "server-restart", "--db", PG_SERVER])
    assert outcome.exit_code == 2
    assert "restarts the database server: add --allow-server-restart" in outcome.output
    for broker in ("broker-restart", "nats-restart"):
        outcome = CliRunner().invoke(main, ["chaos", "--scenario", broker, "--db", PG_SERVER])
        assert outcome.exit_code == 2
        assert "restarts the broker: add --allow-server-restart" in outcome.output


@pytest.mark.postgres
@pytest.mark.parametrize(
    "name", ["server-restart", "store-outage-dispatch", "broker-restart", "nats-restart"]
)
def test_the_scenarios_that_restart_a_server_hold_on_a_private_one(pg_template, name):
    """They run on a PostgreSQL server, a RabbitMQ node or a NATS server the harness starts for
    the run (never the shared one), so the suite runs them too."""
    if SCENARIOS[name].broker == "rabbitmq":
        reachable(AMQP_URL)  # the machine has RabbitMQ: the private node is its program
    if SCENARIOS[name].broker == "nats":
        nats_server_installed()
    result = run_scenario(SCENARIOS[name], server=PG_SERVER, customers=CUSTOMERS, seed=1)
    assert result.ok, [f"{v.invariant}: {v.key}: {v.evidence}" for v in result.violations]


def _process_state(pid: int | None) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_a_stop_freezes_the_lane_that_reached_its_point_before_it_runs_another_line():
    # A SIGSTOP sent to the whole process is taken by whichever thread the kernel wakes (the main
    # thread, blocked in a join): until that thread runs, the lane that sent it goes on, and a
    # "frozen" consumer sent its claim and held the keys' locks through the whole drain.
    gate = Gate(SPAWN.Event(), SPAWN.Event())
    lines_after = SPAWN.RawValue("q", 0)  # no lock: a stopped writer must not hold one
    child = SPAWN.Process(target=stop_in_a_lane_thread, args=(gate, lines_after), daemon=True)
    child.start()
    try:
        assert gate.reached.wait(60), "the lane never reached its point"
        wait_until(lambda: _process_state(child.pid) == "T", what="the process to stop")
        assert lines_after.value == 0
    finally:
        child.kill()
        child.join(10)
