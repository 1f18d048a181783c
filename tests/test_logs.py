"""The worker's log as JSON lines (`oncebox --log-format json`): one object per line, a failed
attempt's key, job id, attempt and worker as fields, and what a handler raised escaped by JSON."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import oncebox


def test_a_failed_attempt_is_one_json_line_with_the_jobs_fields(tmp_path: Path):
    env = {"ONCEBOX_DB": f"sqlite:///{tmp_path / 'logs.db'}", "ONCEBOX_SECRET": "0123456789abcdef"}
    enqueued = oncebox("enqueue", "--app", "support.cli_app", "greet", "name=poison", env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    worked = oncebox(
        "--log-format", "json", "worker", "--app", "support.cli_app", "--until-idle", env=env
    )
    lines = [json.loads(line) for line in worked.stderr.splitlines() if line.startswith("{")]
    failed = [line for line in lines if line.get("key") == "greeting/poison"]
    assert len(failed) == 1, worked.stderr
    assert failed[0]["level"] == "warning"
    assert (failed[0]["job_id"], failed[0]["attempt"]) == (1, 1)
    assert failed[0]["worker"].endswith(":c0")
    assert "cannot greet poison" in failed[0]["message"]
    # every line on stderr is one JSON object: nothing a pipeline would have to guess at
    assert all(line.startswith("{") for line in worked.stderr.splitlines() if line.strip())


def test_the_text_log_stays_the_default(tmp_path: Path):
    env = {"ONCEBOX_DB": f"sqlite:///{tmp_path / 'logs.db'}", "ONCEBOX_SECRET": "0123456789abcdef"}
    oncebox("enqueue", "--app", "support.cli_app", "greet", "name=poison", env=env)
    worked = oncebox("worker", "--app", "support.cli_app", "--until-idle", env=env)
    assert "failed attempt 1; dead: ValueError: cannot greet poison" in worked.stderr
    assert not any(line.startswith("{") for line in worked.stderr.splitlines())


def test_a_json_line_carries_the_current_spans_trace_id():
    import logging

    from opentelemetry.sdk.trace import TracerProvider

    from oncebox.kernel.logs import JsonLines, job_fields

    tracer = TracerProvider().get_tracer("test")
    record = logging.LogRecord("oncebox.consumer", logging.WARNING, __file__, 1, "failed", (), None)
    record.__dict__.update(job_fields("k/1", 7, 2, "host:1:c0"))
    outside = json.loads(JsonLines().format(record))
    with tracer.start_as_current_span("process") as span:
        inside = json.loads(JsonLines().format(record))
        trace_id = f"{span.get_span_context().trace_id:032x}"
    assert "trace_id" not in outside
    assert inside["trace_id"] == trace_id and inside["key"] == "k/1" and inside["attempt"] == 2
