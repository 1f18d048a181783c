"""The Flask example (examples/flask_signups) on both stores: a sign-up the database refuses
leaves no job; every customer is welcomed once, however often the job runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from examples.flask_signups.app import Signups, build
from opentelemetry.trace import SpanKind

from conftest import TEST_SECRET
from oncebox.testing import drain
from support.spans import named, parent_of, span_id, trace_id


@pytest.fixture
def signups(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Signups]:
    monkeypatch.setenv("ONCEBOX_EMAIL", f"file://{tmp_path / 'outbox'}")
    monkeypatch.setenv("ONCEBOX_SECRET", TEST_SECRET)
    made = build(store_url)
    try:
        yield made
    finally:
        made.engine.dispose()
        made.box.close()


def emails(tmp_path: Path) -> list[str]:
    return [p.read_text() for p in sorted((tmp_path / "outbox").glob("*.eml"))]


def test_each_customer_is_welcomed_once(signups: Signups, tmp_path: Path):
    client = signups.app.test_client()
    ada = client.post("/customers", json={"email": "ada@example.com", "name": "Ada"})
    bob = client.post("/customers", json={"email": "bob@example.com", "name": "Bob"})
    assert (ada.status_code, bob.status_code) == (201, 201)
    assert drain(signups.box).completed == 2
    # the welcome of Ada enqueued again (a replayed request, a script run twice): its key refuses
    again = signups.box.enqueue("welcome", customer_id=ada.get_json()["customer"])
    assert (again.created, again.reason) == (False, "key_claimed")
    sent = emails(tmp_path)
    assert len(sent) == 2 and any("Hello Ada!" in e for e in sent)


def test_a_refused_sign_up_leaves_no_job(signups: Signups, tmp_path: Path):
    client = signups.app.test_client()
    first = client.post("/customers", json={"email": "ada@example.com", "name": "Ada"})
    taken = client.post("/customers", json={"email": "ada@example.com", "name": "Ada again"})
    assert (first.status_code, taken.status_code) == (201, 409)
    assert drain(signups.box).completed == 1
    assert len(emails(tmp_path)) == 1


def test_a_sign_up_its_welcome_and_the_email_are_one_trace(
    signups: Signups, spans: Any, tmp_path: Path
):
    client = signups.app.test_client()
    assert (
        client.post("/customers", json={"email": "ada@example.com", "name": "Ada"}).status_code
        == 201
    )
    drain(signups.box)
    finished = spans.get_finished_spans()
    (request,) = [s for s in finished if s.kind == SpanKind.SERVER]
    (enqueue,) = named(finished, "enqueue")
    (process,) = named(finished, "process")
    (send,) = named(finished, "send")
    assert request.name == "POST /customers"
    assert parent_of(enqueue) == span_id(request)
    assert parent_of(process) == span_id(enqueue)
    assert parent_of(send) == span_id(process)
    assert len({trace_id(s) for s in (request, enqueue, process, send)}) == 1
    assert len(emails(tmp_path)) == 1
