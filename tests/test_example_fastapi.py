"""The FastAPI example (examples/fastapi_bookings) against real PostgreSQL: a request that
enqueues and then fails leaves no hold and no job; one that succeeds is expired once and its
guest emailed once, however often the request is retried or the job redelivered."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from examples.fastapi_bookings.app import HOLD_FOR, Bookings, build
from fastapi.testclient import TestClient
from opentelemetry.trace import SpanKind

from conftest import TEST_SECRET
from oncebox.testing import FrozenClock, drain
from support.spans import attributes, named, parent_of, span_id, trace_id

pytestmark = pytest.mark.postgres


@pytest.fixture
def bookings(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bookings]:
    monkeypatch.setenv("ONCEBOX_EMAIL", f"file://{tmp_path / 'outbox'}")
    monkeypatch.setenv("ONCEBOX_SECRET", TEST_SECRET)
    made = build(pg_url)
    try:
        yield made
    finally:
        made.box.close()


def emails(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "outbox").glob("*.eml"))


T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
HOLD = {"id": 7, "guest_email": "ada@example.com", "nights": 2}


def test_a_hold_expires_once_and_its_guest_is_emailed_once(bookings: Bookings, tmp_path: Path):
    with TestClient(bookings.app) as client, FrozenClock(bookings.box, at=T0) as clock:
        placed = client.post("/holds", json=HOLD)
        again = client.post("/holds", json={**HOLD, "id": 8})
        assert (placed.status_code, again.status_code) == (201, 201)
        assert drain(bookings.box).completed == 0  # not due for fifteen minutes
        clock.advance(HOLD_FOR + timedelta(seconds=1))
        assert drain(bookings.box).completed == 2
        # a second expiry of the same hold (a bug's, or an operator's): refused by its key
        second = bookings.box.enqueue("expire_hold", hold_id=7)
        drained = drain(bookings.box)
        status = client.get("/holds/7").json()
    assert (second.created, second.reason, drained.completed) == (False, "key_claimed", 0)
    assert status["state"] == "expired" and status["emails"] == ["sent"]
    assert len(emails(tmp_path)) == 2
    assert "ada@example.com" in "".join(p.read_text() for p in emails(tmp_path))


def test_a_request_refused_after_its_enqueue_leaves_no_hold_and_no_job(
    bookings: Bookings, tmp_path: Path
):
    with TestClient(bookings.app) as client:
        refused = client.post("/holds", json={**HOLD, "nights": 40})
        missing = client.get("/holds/7")
    assert refused.status_code == 422 and "nights" in refused.json()["detail"]
    assert missing.status_code == 404
    assert bookings.box.store.job_find_by_key("hold-expired/hold-7") == []


def test_a_retried_request_places_one_hold_and_one_expiry(bookings: Bookings, tmp_path: Path):
    with TestClient(bookings.app) as client, FrozenClock(bookings.box, at=T0) as clock:
        first = client.post("/holds", json=HOLD)
        retried = client.post("/holds", json=HOLD)  # the client timed out and tried again
        clock.advance(HOLD_FOR + timedelta(seconds=1))
        drain(bookings.box)
    assert first.status_code == 201 and retried.status_code == 409
    assert len(bookings.box.store.job_find_by_key("hold-expired/hold-7")) == 1
    assert len(emails(tmp_path)) == 1


def test_a_request_its_expiry_and_the_guests_email_are_one_trace(
    bookings: Bookings, spans: Any, tmp_path: Path
):
    with TestClient(bookings.app) as client, FrozenClock(bookings.box, at=T0) as clock:
        assert client.post("/holds", json=HOLD).status_code == 201
        clock.advance(HOLD_FOR + timedelta(seconds=1))
        drain(bookings.box)
    finished = spans.get_finished_spans()
    (request,) = [s for s in finished if s.name == "POST /holds" and s.kind == SpanKind.SERVER]
    (enqueue,) = named(finished, "enqueue")
    (process,) = named(finished, "process")
    (send,) = named(finished, "send")
    assert parent_of(enqueue) == span_id(request)
    assert parent_of(process) == span_id(enqueue)
    assert parent_of(send) == span_id(process)
    assert len({trace_id(s) for s in (request, enqueue, process, send)}) == 1
    assert attributes(process)["oncebox.key"] == "hold-expired/hold-7"
    assert len(emails(tmp_path)) == 1
