"""The HTTP API served for real, called by plain HTTP clients: concurrent identical requests
against PostgreSQL (the Idempotency-Key answers once, the business key writes once, a schedule
fans out once), and the whole path — enqueue over HTTP, a worker, the key's receipts read back
over HTTP — with the discovery page's own Python example run as a client would run it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from oncebox import Box
from oncebox.api.keys import issue_key
from oncebox.clock import ClockSetting
from oncebox.examples.logistics.app import build_box, create_tables
from oncebox.examples.logistics.seed import seed_freight
from support.api_server import call, served_api
from support.contract import T0

DIGEST = "/v1/tasks/weekly_digest/jobs"
CALLERS = 8


def at_once(work: Callable[[int], Any], count: int = CALLERS) -> list[Any]:
    """`work(i)` in `count` threads released together; their results in order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        barrier.wait(30)
        results[index] = work(index)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(r is not None for r in results), "a caller did not finish"
    return results


def jobs_in(box: Box) -> int:
    return sum(v for k, v in box.store.job_count_by_state().counts.items() if ":" not in k)


@pytest.fixture
def freight(tmp_path: Path, pg_url: str) -> Box:
    box = build_box(pg_url, email=f"file://{tmp_path / 'sent'}")
    create_tables(box)
    return box


@pytest.mark.postgres
def test_concurrent_requests_with_one_idempotency_key_answer_once_and_write_once(freight):
    token = issue_key(freight.store, "app", ["enqueue"], by="test").token
    body = {"args": {"customer_id": 42, "period": "2026-W33"}}
    with served_api(freight) as base:
        answers = at_once(
            lambda _: call("POST", base + DIGEST, token, body, {"Idempotency-Key": "order-42"})
        )
        first = [a for a in answers if a[0] == 201 and "idempotent-replayed" not in a[1]]
        assert len(first) == 1, [a[0] for a in answers]
        for status, headers, shape in answers:
            if status == 201:
                assert shape == first[0][2]
            else:  # the first was still being answered: a retry gets its answer
                assert status == 409 and shape["type"].endswith("idempotency-key-in-flight")
                assert headers["retry-after"] == "1"
        retried = call("POST", base + DIGEST, token, body, {"Idempotency-Key": "order-42"})
    assert retried[0] == 201 and retried[1]["idempotent-replayed"] == "true"
    assert retried[2] == first[0][2]
    assert jobs_in(freight) == 1


@pytest.mark.postgres
def test_concurrent_identical_enqueues_without_an_idempotency_key_write_one_job(freight):
    token = issue_key(freight.store, "app", ["enqueue"], by="test").token
    body = {"args": {"customer_id": 7, "period": "2026-W33"}}
    with served_api(freight) as base:
        answers = at_once(lambda _: call("POST", base + DIGEST, token, body))
    created = [shape for status, _, shape in answers if status == 201]
    assert len(created) == 1, [a[0] for a in answers]
    others = [shape for status, _, shape in answers if status == 200]
    assert len(others) == CALLERS - 1
    assert {o["job_id"] for o in others} == {created[0]["job_id"]}
    assert all(not o["created"] for o in others)
    assert jobs_in(freight) == 1


@pytest.mark.postgres
def test_concurrent_triggers_fan_a_period_out_once(freight):
    seed_freight(freight, 40, "2026-W34", random.Random(3), T0)
    freight.store.clock_set(ClockSetting(frozen_at=T0 + timedelta(days=7, minutes=2)))
    token = issue_key(freight.store, "cron", ["operate"], by="test").token
    with served_api(freight) as base:
        answers = at_once(
            lambda _: call("POST", base + "/v1/schedules/weekly-digest/fire", token), 4
        )
    statuses = sorted(status for status, _, _ in answers)
    assert statuses.count(202) == 1, statuses
    assert set(statuses) <= {200, 202, 409}  # already claimed, or (overlap) still fanning out
    assert {shape.get("period") for s, _, shape in answers if s != 409} == {"2026-W35"}
    assert jobs_in(freight) == 36  # every active customer, once (the server waited for it)


def test_enqueued_over_http_processed_by_a_worker_and_its_receipts_read_back(tmp_path):
    box = build_box(f"sqlite:///{tmp_path / 'e2e.db'}", email=f"file://{tmp_path / 'sent'}")
    create_tables(box)
    seed_freight(box, 4, "2026-W33", random.Random(4), T0)  # 2 is the poison
    token = issue_key(box.store, "app", ["enqueue", "read"], by="test").token
    with served_api(box) as base:
        made = call(
            "POST", base + DIGEST, token, {"args": {"customer_id": 1, "period": "2026-W33"}}
        )
        assert made[0] == 201, made
        box.work(until_idle=True)  # the worker: the job, then its message
        status, _, chain = call("GET", base + made[2]["links"]["key"], token)
        assert status == 200
        assert [j["state"] for j in chain["jobs"]] == ["done"]
        assert chain["intent"]["job_id"] == made[2]["job_id"]
        assert [m["state"] for m in chain["messages"]] == ["sent"]
        assert chain["messages"][0]["to"] == ["ops1@customer.example"]
        # the discovery page's Python example, run as a caller would run it
        status, _, page = call("GET", base + "/v1/discovery/enqueue:weekly_digest", token)
        assert status == 200 and page["request"]["properties"]["args"]["required"] == [
            "customer_id",
            "period",
        ]
        env = {**os.environ, "ONCEBOX_API": base, "ONCEBOX_API_KEY": token}
        ran = subprocess.run(
            [sys.executable, "-c", page["examples"]["python"]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("201 {"), ran.stdout
    assert jobs_in(box) == 2  # the example's own job, under its own key
    box.close()
