"""The samples of docs/api.md: real `curl` commands against the API served for real, over the
freight example on SQLite with the store's clock frozen on a Monday 30 s before its schedule is
due, and what they printed. `make api-samples` writes them into the page's marked blocks;
tests/test_api_doc_samples.py runs the story again and compares (masked as docs/cli.md's are).

Each sample is a shell command as a reader types it — `$ONCEBOX_API` and `$ONCEBOX_API_KEY` (or
`$ONCEBOX_CRON_KEY`) in the environment — and its output: `curl -i`'s status line, the headers a
caller acts on (the rest, `date` and `content-length`, are left out), and the JSON body indented,
its strings over 100 characters cut (an email's rendered body) with an ellipsis.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oncebox import Box
from oncebox.api.keys import issue_key
from oncebox.examples.logistics.app import build_box, create_tables
from oncebox.examples.logistics.seed import seed_freight
from oncebox.kernel.clock import ClockSetting
from support.api_server import served_api
from support.doc_samples import DOCS, rewrite
from support.waiting import wait_until

PAGE = DOCS / "api.md"
NOW = datetime(2026, 12, 7, 8, 59, 30, tzinfo=UTC)  # a Monday, 30 s before 09:00
LONGEST = 100
SHOWN_HEADERS = (
    "content-type",
    "location",
    "retry-after",
    "idempotent-replayed",
    "www-authenticate",
)
AUTH = '-H "Authorization: Bearer $ONCEBOX_API_KEY"'
CRON = '-H "Authorization: Bearer $ONCEBOX_CRON_KEY"'
JSON = '-H "Content-Type: application/json"'
DIGEST = '"$ONCEBOX_API/v1/tasks/weekly_digest/jobs"'
ARGS_42 = """'{"args": {"customer_id": 42, "period": "2026-W49"}}'"""


@dataclass(frozen=True)
class Sample:
    name: str
    command: str
    before: Callable[[Box], None] | None = None  # what happens in the app first (a worker run)


def _work(box: Box) -> None:
    box.work(until_idle=True)


def _fanned_out(box: Box) -> None:
    """The fired period's fan-out, which the server runs after its answer, then the worker."""

    def finished() -> bool:
        runs = box.store.schedule_run_list("weekly-digest")
        return bool(runs) and all(run.state != "running" for run in runs)

    wait_until(finished, what="the fired period's fan-out", timeout=60)
    box.work(until_idle=True)


SAMPLES: Sequence[Sample] = (
    Sample(
        "api-enqueue",
        f"curl -sS -i -X POST {DIGEST} \\\n  {AUTH} {JSON} \\\n"
        f'  -H "Idempotency-Key: order-42" \\\n  -d {ARGS_42}',
    ),
    Sample(
        "api-enqueue-replayed",
        f"curl -sS -i -X POST {DIGEST} \\\n  {AUTH} {JSON} \\\n"
        f'  -H "Idempotency-Key: order-42" \\\n  -d {ARGS_42}',
    ),
    Sample(
        "api-enqueue-key-reused",
        f"curl -sS -i -X POST {DIGEST} \\\n  {AUTH} {JSON} \\\n"
        f'  -H "Idempotency-Key: order-42" \\\n'
        """  -d '{"args": {"customer_id": 43, "period": "2026-W49"}}'""",
    ),
    Sample(
        "api-enqueue-claimed",
        f"curl -sS -i -X POST {DIGEST} \\\n  {AUTH} {JSON} \\\n  -d {ARGS_42}",
    ),
    Sample(
        "api-enqueue-invalid",
        f"curl -sS -i -X POST {DIGEST} \\\n  {AUTH} {JSON} \\\n"
        """  -d '{"args": {"customer_id": "42", "period": "2026-W49"}}'""",
    ),
    Sample(
        "api-enqueue-batch",
        f'curl -sS -i -X POST "$ONCEBOX_API/v1/tasks/weekly_digest/jobs:batch" \\\n'
        f"  {AUTH} {JSON} \\\n"
        """  -d '{"jobs": [{"customer_id": 42, "period": "2026-W49"},"""
        """ {"customer_id": 44, "period": "2026-W49"}], "delay": 3600}'""",
    ),
    Sample("api-job", f'curl -sS -i "$ONCEBOX_API/v1/jobs/1" {AUTH}', _work),
    Sample(
        "api-key", f'curl -sS -i "$ONCEBOX_API/v1/keys/weekly-digest/customer-42/2026-W49" {AUTH}'
    ),
    Sample(
        "api-fire", f'curl -sS -i -X POST "$ONCEBOX_API/v1/schedules/weekly-digest/fire" {CRON}'
    ),
    Sample(
        "api-fire-again",
        f'curl -sS -i -X POST "$ONCEBOX_API/v1/schedules/weekly-digest/fire" {CRON}',
    ),
    Sample(
        "api-periods",
        f'curl -sS -i "$ONCEBOX_API/v1/periods/weekly-digest?periods=1" {AUTH}',
        _fanned_out,
    ),
    Sample(
        "api-replay",
        "curl -sS -i -X POST \\\n"
        '  "$ONCEBOX_API/v1/dead-letters/weekly-digest/customer-30/2026-W50/replay" \\\n'
        f"  {CRON} {JSON} \\\n"
        """  -d '{"reason": "the address is fixed in the CRM"}'""",
    ),
    Sample("api-unauthorized", 'curl -sS -i "$ONCEBOX_API/v1/periods"'),
    Sample(
        "api-forbidden",
        f'curl -sS -i -X POST "$ONCEBOX_API/v1/schedules/weekly-digest/fire" {AUTH}',
    ),
    Sample(
        "api-discovery",
        f'curl -sS "$ONCEBOX_API/v1/discovery" {AUTH} \\\n'
        """  | jq -r '.capabilities[] | "\\(.method) \\(.path)  [\\(.scope // "any key")]"'""",
    ),
    Sample(
        "api-discovery-example",
        f'curl -sS "$ONCEBOX_API/v1/discovery/enqueue:weekly_digest" {AUTH} \\\n'
        "  | jq -r .examples.curl",
    ),
)


def _shown(output: str) -> str:
    """`curl -i`'s output as the page shows it (see the module docstring); other output as is."""
    if not output.startswith("HTTP/"):
        return output.rstrip("\n")
    head, _, body = output.replace("\r\n", "\n").partition("\n\n")
    lines = head.split("\n")
    kept = [lines[0].strip()] + [
        line for line in lines[1:] if line.split(":", 1)[0].lower() in SHOWN_HEADERS
    ]
    try:
        pretty = json.dumps(_cut(json.loads(body)), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = body.rstrip("\n")
    return "\n".join(kept) + "\n\n" + pretty


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > LONGEST:
        return value[:LONGEST] + "…"
    if isinstance(value, dict):
        return {name: _cut(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_cut(item) for item in value]
    return value


def record() -> dict[str, str]:
    """Run the story; every sample's `$ command` and what it printed, by name."""
    folder = Path(tempfile.mkdtemp(prefix="oncebox-api-samples-"))
    box = build_box(
        f"sqlite:///{folder / 'freight.db'}",
        email=f"file://{folder / 'sent'}",
        secret="the-api-samples-secret",  # the same outbox tokens every run
    )
    create_tables(box)
    seed_freight(box, 60, "2026-W50", random.Random(7), NOW)
    box.store.clock_set(ClockSetting(frozen_at=NOW))
    app_key = issue_key(box.store, "freight-web", ["enqueue", "read"], by="ops").token
    cron_key = issue_key(box.store, "cron", ["operate"], by="ops").token
    recorded: dict[str, str] = {}
    try:
        with served_api(box) as base:
            env = {
                **os.environ,
                "ONCEBOX_API": base,
                "ONCEBOX_API_KEY": app_key,
                "ONCEBOX_CRON_KEY": cron_key,
            }
            for sample in SAMPLES:
                if sample.before is not None:
                    sample.before(box)
                ran = subprocess.run(
                    ["bash", "-c", sample.command.replace("\\\n", " ")],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                if ran.returncode != 0:
                    raise AssertionError(f"{sample.name}: {ran.stderr.strip()}")
                shown = _shown(ran.stdout).replace(base, "http://127.0.0.1:8080")
                recorded[sample.name] = f"$ {sample.command}\n{shown}"
    finally:
        box.close()
        shutil.rmtree(folder, ignore_errors=True)
    return recorded


def main(argv: Sequence[str] | None = None) -> int:
    del argv
    changed = rewrite(PAGE, record())
    print("\n".join(f"rewrote {where}" for where in changed) or "docs/api.md is current")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
