"""The HTTP API served for real, called by plain HTTP clients: concurrent identical requests
against PostgreSQL (the Idempotency-Key answers once, the business key writes once, a schedule
fans out once), and the whole path — enqueue over HTTP, a worker, the key's receipts read back
over HTTP — with the discovery page's own Python example run as a client would run it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from oncebox import Box
from oncebox.api import idempotency
from oncebox.api.idempotency import RETAIN, fingerprint
from oncebox.api.keys import issue_key
from oncebox.chaos.mutations import mutated
from oncebox.examples.logistics.app import build_box, create_tables
from oncebox.examples.logistics.seed import seed_freight
from oncebox.kernel.clock import ClockSetting
from oncebox.store.postgres import PostgresStore
from oncebox.store.records import ApiRequestClaim
from support.api_server import call, served_api
from support.contract import T0
from support.seeded_work import work_seeded
from support.waiting import wait_until

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
        work_seeded(box)  # the worker: the job, then its message
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


# -- an Idempotency-Key's holder: at work, or gone -------------------------------------------------

HELD = "order-9"
BODY = {"args": {"customer_id": 9, "period": "2026-W33"}}
HOLD = timedelta(seconds=30)  # the holder's hold, in these tests


@pytest.fixture
def holding(monkeypatch: pytest.MonkeyPatch) -> timedelta:
    """A hold of 30 s, renewed every 10 ms: a working holder renews within a test's patience."""
    monkeypatch.setattr(idempotency, "HOLD", HOLD)
    monkeypatch.setattr(idempotency, "RENEW_EVERY", timedelta(milliseconds=10))
    return HOLD


@dataclass(frozen=True)
class Taking:
    """What a second request with a held key was answered while the holder was still at work —
    61 s into the holder's request and 10 min in, each time once the holder had renewed its hold
    on the moved clock (or lost it) — then the holder's own answer, and a retry's (its status,
    whether it is the holder's answer replayed)."""

    at_61_s: int
    past_its_first_hold: int
    holder: int
    retry: tuple[int, bool]


def race_working_holder(url: str, sent: Path) -> Taking:
    box = build_box(url, email=f"file://{sent}")
    create_tables(box)
    issued = issue_key(box.store, "app", ["enqueue"], by="test")
    token, key_id = issued.token, issued.row.id
    box.store.clock_set(ClockSetting(frozen_at=T0))
    at_work, done = threading.Event(), threading.Event()
    insert = box.store.job_insert

    def working_insert(job: Any, connection: object | None = None) -> Any:
        if not at_work.is_set():  # the holder's route, at work until the test says
            at_work.set()
            done.wait(60)
        return insert(job, connection=connection)

    box.store.job_insert = working_insert  # type: ignore[method-assign]
    answers: list[tuple[int, dict[str, str], Any]] = []
    try:
        with served_api(box) as base:

            def post() -> tuple[int, dict[str, str], Any]:
                return call("POST", base + DIGEST, token, BODY, {"Idempotency-Key": HELD})

            def renewed_or_lost() -> bool:
                found = box.store.api_request_get(key_id, HELD)
                assert found is not None and found.held_until is not None
                return found.claim != held or found.held_until > box.store.clock_now()

            holder = threading.Thread(target=lambda: answers.append(post()))
            holder.start()
            assert at_work.wait(30), "the holder's route never started"
            record = box.store.api_request_get(key_id, HELD)
            assert record is not None
            held = record.claim
            statuses = []
            for at in (timedelta(seconds=61), timedelta(minutes=10)):
                box.store.clock_set(ClockSetting(frozen_at=T0 + at))
                wait_until(renewed_or_lost, what="the holder's renewal on the moved clock")
                statuses.append(post()[0])
            at_61_s, past_its_first_hold = statuses
            done.set()
            holder.join(60)
            retry = post()
    finally:
        done.set()
        box.close()
    ((status, _, first),) = answers
    return Taking(
        at_61_s,
        past_its_first_hold,
        status,
        (retry[0], retry[1].get("idempotent-replayed") == "true" and retry[2] == first),
    )


def test_an_idempotency_key_stays_with_a_holder_at_work_past_60_s(
    store_url: str, tmp_path: Path, holding: timedelta
):
    taking = race_working_holder(store_url, tmp_path / "sent")
    assert taking == Taking(409, 409, 201, (201, True)), taking


def test_an_idempotency_key_whose_holder_is_gone_is_taken_over_once_its_hold_ran_out(
    store_url: str, tmp_path: Path, holding: timedelta
):
    box = build_box(store_url, email=f"file://{tmp_path / 'sent'}")
    create_tables(box)
    issued = issue_key(box.store, "app", ["enqueue"], by="test")
    request = fingerprint("POST", DIGEST, json.dumps(BODY).encode())
    box.store.clock_set(ClockSetting(frozen_at=T0))
    gone = ApiRequestClaim(issued.row.id, HELD, request, "gone", RETAIN, holding)
    assert box.store.api_request_claim(gone) is not None  # and nothing renews it
    try:
        with served_api(box) as base:

            def post() -> tuple[int, dict[str, str], Any]:
                return call("POST", base + DIGEST, issued.token, BODY, {"Idempotency-Key": HELD})

            answers = []
            for after in (holding - timedelta(seconds=1), holding):
                box.store.clock_set(ClockSetting(frozen_at=T0 + after))
                answers.append(post())
            assert [a[0] for a in answers] == [409, 201], [a[0] for a in answers]
            # the gone holder, back late, neither records its answer nor keeps the key
            late = (
                box.store.api_request_finish(issued.row.id, HELD, "gone", 201, "{}"),
                box.store.api_request_renew(issued.row.id, HELD, "gone", holding),
            )
            retry = post()
    finally:
        box.close()
    assert late == (False, False)
    assert retry[0] == 201 and retry[1]["idempotent-replayed"] == "true", retry
    assert retry[2] == answers[1][2]


@pytest.mark.postgres
def test_two_requests_taking_over_a_gone_holders_key_at_once_one_takes_it(
    freight: Box, holding: timedelta
):
    issued = issue_key(freight.store, "app", ["enqueue"], by="test")
    request = fingerprint("POST", DIGEST, json.dumps(BODY).encode())
    freight.store.clock_set(ClockSetting(frozen_at=T0))
    gone = ApiRequestClaim(issued.row.id, HELD, request, "gone", RETAIN, holding)
    assert freight.store.api_request_claim(gone) is not None
    freight.store.clock_set(ClockSetting(frozen_at=T0 + holding))
    assert isinstance(freight.store, PostgresStore)
    taken: dict[str, bool] = {}

    def take(claim: str) -> None:
        mine = ApiRequestClaim(issued.row.id, HELD, request, claim, RETAIN, holding)
        taken[claim] = freight.store.api_request_claim(mine) is not None

    conninfo = freight.store.conninfo
    with psycopg.connect(conninfo) as locker, psycopg.connect(conninfo, autocommit=True) as seer:
        # both takers read the gone holder's record before either writes: they wait on its lock
        locker.execute(
            "SELECT 1 FROM oncebox_api_requests WHERE idempotency_key = %s FOR UPDATE", [HELD]
        )
        takers = [threading.Thread(target=take, args=(c,)) for c in ("taker-1", "taker-2")]
        for thread in takers:
            thread.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        wait_until(
            lambda: seer.execute(waiting).fetchone() == (2,),
            what="both takers waiting on the record's lock",
        )
        locker.rollback()
        for thread in takers:
            thread.join(30)
    found = freight.store.api_request_get(issued.row.id, HELD)
    assert sorted(taken.values()) == [False, True], taken
    assert found is not None and taken[found.claim], (found, taken)


def test_an_idempotency_key_is_taken_from_a_holder_at_work_without_its_fence(
    store_url: str, tmp_path: Path, holding: timedelta
):
    with mutated("idempotency-fixed-takeover"):
        taking = race_working_holder(store_url, tmp_path / "sent")
    # taken over 61 s in, while the holder worked: the answer kept for retries is not its own
    assert (taking.at_61_s, taking.retry[1]) == (201, False), taking
