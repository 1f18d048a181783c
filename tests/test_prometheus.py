"""The numbers reach Prometheus: `oncebox metrics` serves the figures `oncebox status` prints, a
real Prometheus server scrapes it and its query API returns what the store holds, and the
shipped alerting rules pass `promtool check rules` and their own unit tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oncebox.fakes.smtp_sink import free_port
from support.binaries import require
from support.waiting import wait_until
from test_cli import TESTS, assert_one_line_error, oncebox
from test_cli_commands import (
    fan_outs_paused,
    freight,  # noqa: F401 (a fixture)
)

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "src" / "oncebox" / "alerts" / "oncebox.rules.yml"


@pytest.fixture
def worked(freight):  # noqa: F811 (the fixture above)
    """The freight database after a week's digests: a fan-out, a duplicate enqueue, a dead job —
    of that week alone (its worker fans out no other)."""
    url, env, _tmp = freight
    fan_outs_paused(url)
    assert (
        oncebox("schedule", "run", "weekly-digest", "--period", "2026-W33", env=env).returncode == 0
    )
    oncebox("enqueue", "weekly_digest", "customer_id=1", "period=2026-W33", env=env)
    assert oncebox("worker", "--until-idle", env=env).returncode == 0
    return freight


@contextmanager
def serving(*args: str, env: dict[str, str]) -> Iterator[str]:
    """`oncebox ARGS` serving /metrics on a free port: its URL, from the first line it prints;
    stopped with SIGTERM after, which must end it cleanly."""
    process = subprocess.Popen(
        [sys.executable, "-m", "oncebox.cli", *args],
        env={**os.environ, "PYTHONPATH": str(TESTS), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()  # "serving http://127.0.0.1:PORT/metrics …"
        assert first.startswith("serving http://127.0.0.1:"), first
        yield first.split()[1]
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=60)  # closes the pipes too
        assert process.returncode == 0, err


@pytest.fixture
def exporter(worked) -> Iterator[tuple[str, dict[str, str]]]:
    _url, env, _tmp = worked
    with serving("metrics", "--bind", "127.0.0.1:0", env=env) as url:
        yield url, env


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=30).read().decode()  # noqa: S310 (a local URL)
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def test_the_exporter_serves_the_figures_status_prints(exporter):
    url, env = exporter
    served = scrape(url)
    status = json.loads(oncebox("status", "--json", env=env).stdout)
    for name, value in status["counters"].items():
        assert served[f"oncebox_{name}_total"] == value, name
    assert status["counters"]["enqueue_duplicates"] >= 1
    assert status["counters"]["jobs_dead"] == 1 == served["oncebox_dead_letters"]
    for state, count in status["jobs"].items():
        assert served[f"oncebox_jobs{{state={state}}}"] == count
    [period] = status["schedules"][0]["periods"]
    key = f"period={period['period']},schedule=weekly-digest"
    assert served[f"oncebox_period_eligible{{{key}}}"] == period["eligible"]
    assert served[f"oncebox_period_coverage{{{key}}}"] == period["coverage"]


def test_a_bind_that_is_not_host_port_is_a_usage_error(freight):  # noqa: F811
    _url, env, _tmp = freight
    assert_one_line_error(oncebox("metrics", "--bind", "nowhere", env=env), 2, "HOST:PORT")


def test_a_real_prometheus_scrapes_the_exporter_and_answers_with_the_stores_values(
    exporter, tmp_path
):
    prometheus = require("prometheus", "prometheus")
    url, env = exporter
    target = url.removeprefix("http://").removesuffix("/metrics")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: oncebox\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        expected = json.loads(oncebox("status", "--json", env=env).stdout)["counters"]

        def query(expr: str) -> list[dict[str, object]]:
            address = f"http://127.0.0.1:{port}/api/v1/query?query={expr}"
            try:
                body = urllib.request.urlopen(address, timeout=10).read()
            except OSError:
                return []  # not listening yet
            result: list[dict[str, object]] = json.loads(body)["data"]["result"]
            return result

        up = wait_until(lambda: query('up{job="oncebox"}==1'), 60, "Prometheus's first scrape")
        assert up
        [sample] = query("oncebox_enqueue_duplicates_total")
        assert float(sample["value"][1]) == expected["enqueue_duplicates"]  # type: ignore[index]
        [sample] = query("oncebox_jobs_dead_total")
        assert float(sample["value"][1]) == expected["jobs_dead"]  # type: ignore[index]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_alerting_rules_pass_promtool_and_their_unit_tests():
    promtool = require("promtool", "prometheus")
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 12 rules found" in checked.stdout
    tested = subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"],
        cwd=TESTS / "prometheus",
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_a_worker_serves_its_own_figures_and_none_of_the_stores(freight):  # noqa: F811
    _url, env, _tmp = freight
    oncebox("enqueue", "weekly_digest", "customer_id=1", "period=2026-W33", env=env)
    with serving("worker", "--metrics-bind", "127.0.0.1:0", env=env) as url:

        def leased() -> float:
            return scrape(url).get("oncebox_store_operation_calls_total{operation=job_lease}", 0)

        wait_until(leased, 60, "the worker's first lease, in its own figures")
        served = scrape(url)
        assert not any(name.startswith("oncebox_jobs_enqueued") for name in served)
        assert served["oncebox_store_operation_errors_total{operation=job_lease}"] == 0


def test_the_exporter_can_be_stopped_as_soon_as_it_says_it_serves(tmp_path, monkeypatch):
    """Whoever reads "serving …" may send SIGTERM at once (a supervisor, a test): the handler that
    stops it cleanly is in place before the line is printed, not after."""
    from click.testing import CliRunner

    from oncebox import Box
    from oncebox.cli import metrics_cmd
    from oncebox.cli.app import main

    url = f"sqlite:///{tmp_path / 'm.db'}"
    Box(url).close()  # a database to serve
    seen: list[object] = []

    def say(line: str) -> None:
        handler = signal.getsignal(signal.SIGTERM)
        seen.append(handler)
        if callable(handler):
            handler(signal.SIGTERM, None)  # stop it as a reader of the line would
        else:
            raise AssertionError(f"{line!r} printed before its SIGTERM handler was installed")

    monkeypatch.setattr(metrics_cmd, "say", say)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        ran = CliRunner().invoke(
            main,
            ["metrics", "--bind", "127.0.0.1:0", "--db", url],
            catch_exceptions=False,
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert ran.exit_code == 0, ran.output
    assert len(seen) == 1 and callable(seen[0]), seen
