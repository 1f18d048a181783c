"""The HTTP API through its ASGI app: every refusal comes before anything is written and is a
problem detail; an enqueue is Python's enqueue (the key decides); an Idempotency-Key replays the
first answer; a schedule fired over HTTP answers after the claim and fans out once."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from oncebox import Box
from oncebox.api import ApiSettings, create_api
from oncebox.api.idempotency import HOLD, RETAIN, fingerprint
from oncebox.api.keys import issue_key
from oncebox.api.problems import MEDIA_TYPE, TITLES, TYPE_PREFIX
from oncebox.examples.logistics.app import build_box, create_tables
from oncebox.examples.logistics.seed import seed_freight
from oncebox.kernel import points
from oncebox.kernel.clock import ClockSetting
from oncebox.store.records import ApiRequestClaim
from support.contract import T0, dead_job

DIGEST = "/v1/tasks/weekly_digest/jobs"


@dataclass
class Api:
    box: Box
    client: TestClient
    tokens: dict[str, str]

    def headers(self, who: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}", **extra}

    def post(self, path: str, who: str = "app", body: Any = None, **headers: str) -> Any:
        return self.client.post(path, headers=self.headers(who, **headers), json=body)

    def get(self, path: str, who: str = "app") -> Any:
        return self.client.get(path, headers=self.headers(who))

    def jobs(self) -> int:
        return sum(v for k, v in self.box.store.job_count_by_state().counts.items() if ":" not in k)


def digest(customer: int = 42, period: str = "2026-W33") -> dict[str, Any]:
    return {"args": {"customer_id": customer, "period": period}}


def is_problem(response: Any, status: int, kind: str) -> dict[str, Any]:
    """The response is the RFC 9457 problem `kind` with `status`; its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == MEDIA_TYPE
    body: dict[str, Any] = response.json()
    assert body["type"] == TYPE_PREFIX + kind and body["title"] == TITLES[kind]
    assert body["status"] == status and body["detail"]
    return body


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    box = build_box(f"sqlite:///{tmp_path / 'api.db'}", email=f"file://{tmp_path / 'sent'}")
    create_tables(box)
    tokens = {
        "app": issue_key(box.store, "app", ["enqueue", "read"], by="test").token,
        "viewer": issue_key(box.store, "viewer", ["read"], by="test").token,
        "ops": issue_key(box.store, "ops", ["operate"], by="test").token,
        "slow": issue_key(box.store, "slow", ["read"], rate="2/min", by="test").token,
    }
    with TestClient(create_api(box, ApiSettings()), raise_server_exceptions=False) as client:
        yield Api(box, client, tokens)
    box.close()


# -- who may call ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Basic dXNlcjpwYXNz",
        "Bearer ",
        "Bearer obx_1",
        "Bearer obx_x_secret",
        "Bearer obx_1_wrong-secret",
        "Bearer obx_99999_secret",
        "Bearer obx_99999999999999999999999_secret",
        "Bearer sk_1_secret",
    ],
)
def test_a_request_without_a_live_key_is_refused_before_anything_is_written(api, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    answer = api.client.post(DIGEST, headers=headers, json=digest())
    is_problem(answer, 401, "unauthorized")
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert api.jobs() == 0


def test_a_revoked_key_is_refused_from_its_next_request(api):
    assert api.get("/v1/periods", "viewer").status_code == 200
    api.box.store.api_key_revoke("viewer")
    is_problem(api.get("/v1/periods", "viewer"), 401, "unauthorized")


def test_each_route_needs_its_scope_and_operate_includes_read(api):
    is_problem(api.post(DIGEST, "viewer", digest()), 403, "forbidden")
    is_problem(api.post(DIGEST, "ops", digest()), 403, "forbidden")
    is_problem(api.post("/v1/schedules/weekly-digest/fire", "app"), 403, "forbidden")
    body = {"reason": "x"}
    is_problem(api.post("/v1/dead-letters/k/replay", "viewer", body), 403, "forbidden")
    assert api.get("/v1/periods", "ops").status_code == 200
    assert api.get("/openapi.json", "ops").status_code == 200
    assert api.jobs() == 0


def test_a_key_over_its_budget_waits_as_retry_after_says_on_the_stores_clock(api):
    api.box.store.clock_set(ClockSetting(frozen_at=T0))
    assert [api.get("/v1/periods", "slow").status_code for _ in range(2)] == [200, 200]
    refused = api.get("/v1/periods", "slow")
    is_problem(refused, 429, "rate-limited")
    assert refused.headers["retry-after"] == "30"  # 2/min: one request back every 30 s
    assert api.get("/v1/periods", "viewer").status_code == 200  # another key's budget is its own
    api.box.store.clock_set(ClockSetting(frozen_at=T0 + timedelta(seconds=29)))
    is_problem(api.get("/v1/periods", "slow"), 429, "rate-limited")
    api.box.store.clock_set(ClockSetting(frozen_at=T0 + timedelta(seconds=30)))
    assert api.get("/v1/periods", "slow").status_code == 200


# -- what a body must be ---------------------------------------------------------------------------


def test_a_body_over_the_cap_is_refused_unread_whether_or_not_its_length_is_declared(api):
    cap = api.box.max_payload_bytes + 64 * 1024
    big = json.dumps({"args": {"customer_id": 1, "period": "x" * cap}}).encode()
    declared = api.client.post(
        DIGEST, headers=api.headers("app", **{"Content-Type": "application/json"}), content=big
    )
    is_problem(declared, 413, "body-too-large")

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    streamed = api.client.post(
        DIGEST, headers=api.headers("app", **{"Content-Type": "application/json"}), content=chunks()
    )
    is_problem(streamed, 413, "body-too-large")
    assert api.jobs() == 0


def test_arguments_within_the_cap_but_over_the_job_limit_are_the_jobs_problem(api):
    period = "x" * (api.box.max_payload_bytes + 10)
    is_problem(api.post(DIGEST, "app", digest(1, period)), 413, "payload-too-large")
    assert api.jobs() == 0


@pytest.mark.parametrize(
    ("content", "content_type", "status", "kind"),
    [
        (b'{"args": {', "application/json", 400, "malformed-request"),
        (b"\xff\xfe{}", "application/json", 400, "malformed-request"),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "malformed-request"),
        (b"customer_id=42", "application/x-www-form-urlencoded", 415, "unsupported-media-type"),
        (b'{"args": {}}', "text/plain", 415, "unsupported-media-type"),
        (b"[1, 2]", "application/json", 422, "invalid-arguments"),
        (b'{"args": [42]}', "application/json", 422, "invalid-arguments"),
        (b'{"args": {"customer_id": 42}, "when": 1}', "application/json", 422, "invalid-arguments"),
        (
            b'{"args": {"customer_id": "42", "period": "W"}}',
            "application/json",
            422,
            "invalid-arguments",
        ),
        (
            b'{"args": {"customer_id": 42, "period": "W", "x": 1}}',
            "application/json",
            422,
            "invalid-arguments",
        ),
        (
            b'{"args": {"customer_id": 42, "period": "a b"}}',
            "application/json",
            422,
            "invalid-arguments",
        ),
    ],
)
def test_a_body_that_is_not_the_tasks_json_is_refused_with_what_is_wrong(
    api, content, content_type, status, kind
):
    headers = api.headers("app", **{"Content-Type": content_type})
    is_problem(api.client.post(DIGEST, headers=headers, content=content), status, kind)
    assert api.jobs() == 0


@pytest.mark.parametrize(
    "options",
    [
        {"run_at": "2026-12-07T06:00:00"},
        {"run_at": "next monday"},
        {"run_at": 1765087200},
        {"delay": -1},
        {"delay": "60"},
        {"delay": 400 * 86400},
        {"delay": 60, "run_at": "2026-12-07T06:00:00Z"},
        {"priority": 1.5},
        {"priority": 5000},
        {"priority": True},
    ],
)
def test_when_to_run_is_checked_before_the_enqueue(api, options):
    is_problem(api.post(DIGEST, "app", {**digest(), **options}), 422, "invalid-arguments")
    assert api.jobs() == 0


def test_unknown_tasks_routes_and_methods_are_problems_too(api):
    body = is_problem(api.post("/v1/tasks/nope/jobs", "app", digest()), 404, "unknown-task")
    assert body["detail"] == "no task named 'nope' is registered"  # not the others: item 9
    batch = api.post("/v1/tasks/nope/jobs:batch", "app", {"jobs": [digest()["args"]]})
    assert is_problem(batch, 404, "unknown-task")["detail"] == body["detail"]
    is_problem(api.get("/v1/nothing"), 404, "not-found")
    is_problem(api.client.delete(DIGEST, headers=api.headers("app")), 405, "method-not-allowed")
    is_problem(api.get("/v1/jobs/12345"), 404, "not-found")
    is_problem(api.get("/v1/jobs/abc"), 404, "not-found")
    is_problem(api.get("/v1/keys/never/seen"), 404, "not-found")
    is_problem(api.get("/v1/keys/bad%20key"), 400, "malformed-request")


def test_text_from_callers_comes_back_as_inert_json(api):
    name = "<img src=x onerror=alert(1)>\x1b[31m"
    answer = api.post(f"/v1/tasks/{quote(name, safe='')}/jobs", "app", digest())
    body = is_problem(answer, 404, "unknown-task")
    assert "\x1b" not in answer.text  # no control character reaches a terminal or log
    assert "<img src=x onerror=alert(1)>" in body["detail"]  # text, for the caller to escape
    assert answer.headers["x-content-type-options"] == "nosniff"


# -- enqueue ---------------------------------------------------------------------------------------


def test_an_enqueue_over_http_is_pythons_enqueue_and_the_key_decides(api):
    first = api.post(DIGEST, "app", digest())
    assert first.status_code == 201, first.text
    made = first.json()
    assert made["created"] and made["key"] == "weekly-digest/customer-42/2026-W33"
    assert first.headers["location"] == f"/v1/jobs/{made['job_id']}"
    again = api.post(DIGEST, "app", digest())
    assert again.status_code == 200
    assert again.json()["created"] is False and again.json()["reason"] == "active_job"
    assert again.json()["job_id"] == made["job_id"]
    later = api.post(DIGEST, "app", {**digest(43), "delay": 3600, "priority": 5})
    job = api.box.store.job_get(later.json()["job_id"])
    assert job is not None and job.priority == 5
    assert job.run_at - job.created_at == timedelta(hours=1)
    when = api.post(DIGEST, "app", {**digest(44), "run_at": "2030-01-07T06:00:00+01:00"})
    job = api.box.store.job_get(when.json()["job_id"])
    assert job is not None and job.run_at.isoformat() == "2030-01-07T05:00:00+00:00"
    assert api.jobs() == 3


def test_a_batch_is_one_set_written_together_or_not_at_all(api):
    body = {"jobs": [digest(n)["args"] for n in (1, 2, 3)]}
    made = api.post(DIGEST + ":batch", "app", body)
    assert made.status_code == 201 and made.json()["created"] == 3
    again = api.post(DIGEST + ":batch", "app", {"jobs": [digest(n)["args"] for n in (3, 4)]})
    assert again.status_code == 201 and (again.json()["created"], again.json()["skipped"]) == (1, 1)
    bad = {"jobs": [digest(5)["args"], {"customer_id": "five", "period": "W"}]}
    is_problem(api.post(DIGEST + ":batch", "app", bad), 422, "invalid-arguments")
    is_problem(api.post(DIGEST + ":batch", "app", {"jobs": []}), 422, "invalid-arguments")
    is_problem(api.post(DIGEST + ":batch", "app", {"jobs": [1]}), 422, "invalid-arguments")
    assert api.jobs() == 4  # customer 5 was not written: its batch was refused whole


# -- Idempotency-Key -------------------------------------------------------------------------------


def test_the_same_idempotency_key_and_body_get_the_first_answer_again(api):
    first = api.post(DIGEST, "app", digest(), **{"Idempotency-Key": "order-7"})
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    api.box.cancel(first.json()["job_id"], reason="so a second enqueue would create a job")
    again = api.post(DIGEST, "app", digest(), **{"Idempotency-Key": "order-7"})
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    assert api.jobs() == 1
    # a quoted key (a structured-field string) is the same key
    quoted = api.post(DIGEST, "app", digest(), **{"Idempotency-Key": '"order-7"'})
    assert quoted.json() == first.json()


def test_the_same_idempotency_key_with_another_body_is_refused(api):
    assert api.post(DIGEST, "app", digest(1), **{"Idempotency-Key": "k"}).status_code == 201
    is_problem(
        api.post(DIGEST, "app", digest(2), **{"Idempotency-Key": "k"}),
        422,
        "idempotency-key-reused",
    )
    other_path = api.post(
        DIGEST + ":batch", "app", {"jobs": [digest(1)["args"]]}, **{"Idempotency-Key": "k"}
    )
    is_problem(other_path, 422, "idempotency-key-reused")
    assert api.jobs() == 1


def test_an_idempotency_key_still_being_answered_is_a_409_to_retry(api):
    key = next(k for k in api.box.store.api_key_list() if k.name == "app")
    raw = json.dumps(digest()).encode()
    held = ApiRequestClaim(key.id, "busy", fingerprint("POST", DIGEST, raw), "other", RETAIN, HOLD)
    assert api.box.store.api_request_claim(held) is not None
    headers = api.headers("app", **{"Content-Type": "application/json", "Idempotency-Key": "busy"})
    answer = api.client.post(DIGEST, headers=headers, content=raw)
    is_problem(answer, 409, "idempotency-key-in-flight")
    assert answer.headers["retry-after"] == "1"
    assert api.jobs() == 0


def test_idempotency_keys_are_per_api_key_and_a_refusal_is_replayed_too(api):
    refused = api.post(DIGEST, "app", digest(1, "a b"), **{"Idempotency-Key": "k"})
    assert refused.status_code == 422
    again = api.post(DIGEST, "app", digest(1, "a b"), **{"Idempotency-Key": "k"})
    assert again.status_code == 422 and again.headers["idempotent-replayed"] == "true"
    other = issue_key(api.box.store, "other-app", ["enqueue"], by="test").token
    theirs = api.client.post(
        DIGEST, headers={"Authorization": f"Bearer {other}", "Idempotency-Key": "k"}, json=digest(2)
    )
    assert theirs.status_code == 201 and "idempotent-replayed" not in theirs.headers


def test_a_malformed_idempotency_key_is_refused(api):
    for bad in ("", "x" * 256, "caf\u00e9"):
        headers = api.headers("app", **{"Content-Type": "application/json"})
        answer = api.client.post(
            DIGEST,
            headers=[*headers.items(), ("Idempotency-Key", bad.encode("utf-8"))],
            content=json.dumps(digest()).encode(),
        )
        is_problem(answer, 400, "malformed-request")
    assert api.jobs() == 0


# -- reads -----------------------------------------------------------------------------------------


def test_a_job_and_its_keys_receipt_chain_read_back(api):
    made = api.post(DIGEST, "app", digest()).json()
    job = api.get(made["links"]["job"])
    assert job.status_code == 200
    assert job.json()["job"]["args"] == digest()["args"] and job.json()["job"]["state"] == "ready"
    chain = api.get(made["links"]["key"]).json()
    assert chain["key"] == made["key"] and [j["id"] for j in chain["jobs"]] == [made["job_id"]]
    assert chain["intent"] is None and chain["messages"] == []


def test_periods_read_back_per_schedule_and_per_period(api):
    seed_freight(api.box, 20, "2026-W33", random.Random(1), T0)
    api.box.run_schedule("weekly-digest", "2026-W33")
    every = api.get("/v1/periods").json()["schedules"]
    assert [s["name"] for s in every] == ["weekly-digest"]
    assert every[0]["periods"][0]["period"] == "2026-W33"
    one = api.get("/v1/periods/weekly-digest?periods=1").json()
    assert one["periods"][0]["eligible"] == 18 and one["periods"][0]["enqueued"] == 18
    period = api.get("/v1/periods/weekly-digest/2026-W33").json()
    assert period["period"]["period"] == "2026-W33" and period["schedule"] == "weekly-digest"
    is_problem(api.get("/v1/periods/weekly-digest/2026-W01"), 404, "not-found")
    is_problem(api.get("/v1/periods/nope"), 404, "not-found")
    is_problem(api.get("/v1/periods?periods=0"), 400, "malformed-request")
    typo = is_problem(api.get("/v1/periods?period=3"), 400, "malformed-request")
    assert "'period'" in typo["detail"] and "periods" in typo["detail"]
    is_problem(api.get("/v1/jobs/1?verbose=1"), 400, "malformed-request")


# -- operate ---------------------------------------------------------------------------------------


def test_a_dead_letter_replayed_over_http_is_audited_under_the_keys_name(api):
    key = "weekly-digest/customer-42/2026-W33"
    job_id = dead_job(api.box.store, key, "weekly_digest")
    made = api.post(DIGEST, "app", digest(43)).json()
    is_problem(
        api.post(f"/v1/dead-letters/{made['key']}/replay", "ops", {"reason": "x"}),
        409,
        "invalid-state",
    )
    is_problem(api.post(f"/v1/dead-letters/{key}/replay", "ops", {}), 422, "invalid-arguments")
    blank = api.post(f"/v1/dead-letters/{key}/replay", "ops", {"reason": " "})
    is_problem(blank, 422, "invalid-arguments")
    assert api.box.store.job_get(job_id).state == "dead"
    done = api.post(f"/v1/dead-letters/{key}/replay", "ops", {"reason": "provider back"})
    assert done.status_code == 200, done.text
    assert done.json()["replayed"] == "job" and done.json()["id"] == job_id
    audit = api.get(f"/v1/keys/{key}", "ops").json()["audit"]
    assert audit[0]["actor"] == "api:ops" and audit[0]["reason"] == "provider back"
    assert api.box.store.job_get(job_id).state == "ready"


def test_a_fired_schedule_answers_after_the_claim_and_fans_out_once(tmp_path):
    box = build_box(f"sqlite:///{tmp_path / 'fire.db'}", email=f"file://{tmp_path / 'sent'}")
    create_tables(box)
    seed_freight(box, 30, "2026-W34", random.Random(2), T0)
    box.store.clock_set(ClockSetting(frozen_at=T0 + timedelta(days=7, seconds=-30)))
    token = issue_key(box.store, "cron", ["operate"], by="test").token
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_api(box)) as client:
        first = client.post("/v1/schedules/weekly-digest/fire", headers=headers)
        again = client.post("/v1/schedules/weekly-digest/fire", headers=headers)
    # the app's shutdown waited for the fan-out the first trigger handed on
    assert first.status_code == 202, first.text
    assert first.json()["period"] == "2026-W35"  # 30 s early: within the tolerance
    assert first.json()["claimed"] is True and first.json()["late"] is False
    assert again.status_code == 200 and again.json()["claimed"] is False
    assert again.json()["period"] == "2026-W35"
    assert box.store.job_count_by_state()["ready"] == 27  # the active customers, once
    box.close()


def test_a_fire_resumes_the_run_an_earlier_fires_server_left_stalled(tmp_path):
    """Cron-only (no ticker): the first trigger's fan-out fails after its 202; a week later,
    past the run's lease, the next trigger resumes that period before its own."""
    box = build_box(f"sqlite:///{tmp_path / 'fire.db'}", email=f"file://{tmp_path / 'sent'}")
    create_tables(box)
    seed_freight(box, 30, "2026-W34", random.Random(2), T0)
    w35 = T0 + timedelta(days=7, seconds=30)
    box.store.clock_set(ClockSetting(frozen_at=w35))
    token = issue_key(box.store, "cron", ["operate"], by="test").token
    headers = {"Authorization": f"Bearer {token}"}
    fire = "/v1/schedules/weekly-digest/fire"
    failing = {"scheduler.between_batches": points.raising(RuntimeError("the store went away"))}
    with points.installed(failing), TestClient(create_api(box)) as client:
        first = client.post(fire, headers=headers)
    assert first.status_code == 202 and first.json()["resumed"] == [], first.text
    [stalled] = box.store.schedule_run_list("weekly-digest")
    assert (stalled.period, stalled.state) == ("2026-W35", "running")
    box.store.clock_set(ClockSetting(frozen_at=w35 + timedelta(days=7)))
    with TestClient(create_api(box)) as client:
        later = client.post(fire, headers=headers)
    assert later.status_code == 202, later.text
    assert (later.json()["period"], later.json()["resumed"]) == ("2026-W36", ["2026-W35"])
    runs = {run.period: run.state for run in box.store.schedule_run_list("weekly-digest")}
    assert runs == {"2026-W35": "done", "2026-W36": "done"}, runs
    box.close()


def test_a_paused_or_unknown_schedule_is_not_fired(api):
    api.box.pause_schedule("weekly-digest", reason="holiday")
    is_problem(api.post("/v1/schedules/weekly-digest/fire", "ops"), 409, "invalid-state")
    is_problem(api.post("/v1/schedules/nope/fire", "ops"), 404, "not-found")
    assert api.jobs() == 0


# -- what the review found -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "authorization"),
    [
        ("/v1/periods", "Bearer obx_\u00b2_secret"),
        ("/v1/jobs/%C2%B2", None),
        ("/v1/periods?periods=%C2%B2", None),
    ],
)
def test_digits_that_are_not_ascii_are_refused_not_a_server_error(api, path, authorization):
    headers = api.headers("app") if authorization is None else {"Authorization": authorization}
    answer = api.client.get(path, headers=[(k, v.encode()) for k, v in headers.items()])
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.headers["content-type"] == MEDIA_TYPE


def test_control_and_bidi_characters_come_back_escaped(api):
    name = "x\u0085\u202e\x7f"
    answer = api.post(f"/v1/tasks/{quote(name, safe='')}/jobs", "app", digest())
    is_problem(answer, 404, "unknown-task")
    assert answer.text.isascii() and "\\u202e" in answer.text


@pytest.mark.parametrize("run_at", ["2026-12-07 06:00:00+00:00", "20261207T060000Z"])
def test_run_at_is_rfc_3339_not_any_iso_8601(api, run_at):
    is_problem(api.post(DIGEST, "app", {**digest(), "run_at": run_at}), 422, "invalid-arguments")


def test_a_not_now_answer_is_not_replayed_to_a_retry(api):
    api.box.pause_schedule("weekly-digest", reason="holiday")
    fire = "/v1/schedules/weekly-digest/fire"
    is_problem(api.post(fire, "ops", **{"Idempotency-Key": "cron-1"}), 409, "invalid-state")
    api.box.resume_schedule("weekly-digest", reason="back")
    again = api.post(fire, "ops", **{"Idempotency-Key": "cron-1"})
    assert again.status_code == 202 and "idempotent-replayed" not in again.headers
    replayed = api.post(fire, "ops", **{"Idempotency-Key": "cron-1"})
    assert replayed.status_code == 202 and replayed.headers["idempotent-replayed"] == "true"


def test_apps_served_beside_each_other_each_run_their_lifespan():
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from oncebox.api.mounts import beside

    running: list[str] = []

    def app(name: str) -> Starlette:
        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            running.append(name)
            yield
            running.remove(name)

        async def hello(_request: Any) -> PlainTextResponse:
            return PlainTextResponse(name)

        return Starlette(routes=[Route("/hello", hello)], lifespan=lifespan)

    with TestClient(beside(app("api"), {"/console": app("console")})) as client:
        assert sorted(running) == ["api", "console"]
        assert client.get("/hello").text == "api"
        assert client.get("/console/hello").text == "console"
    assert running == []
