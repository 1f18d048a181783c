"""The Flask example (examples/flask_signups) on both stores: a sign-up the database refuses
leaves no job; every customer is welcomed once, however often the job runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from examples.flask_signups.app import Signups, build

from conftest import TEST_SECRET
from oncebox.testing import drain


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
