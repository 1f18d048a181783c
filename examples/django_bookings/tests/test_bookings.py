"""The bookings example under pytest-django, on whichever database BOOKINGS_DB names (the suite
runs it on SQLite and on PostgreSQL: tests/test_example_django.py).

Tests that run jobs use `transaction=True`: oncebox's worker reads what the request committed,
on connections of its own, so a test wrapped in one rolled-back transaction would show it
nothing. oncebox's tables are not Django models, so Django does not empty them between tests:
each test uses holds (and keys) of its own.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from holds.models import Hold, HoldEvent
from holds.tasks import HOLD_FOR, expire_hold

from oncebox import JobContext, Retry
from oncebox.contrib.django import box
from oncebox.jobs.receipts import receipt_chain
from oncebox.testing import FrozenClock, drain

pytestmark = pytest.mark.django_db(transaction=True)
T0 = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
ONCE = Retry(max_attempts=1)


def emails_to(address: str) -> list[str]:
    outbox = Path(settings.ONCEBOX["EMAIL"].removeprefix("file://"))
    return [p.read_text() for p in outbox.glob("*.eml") if address in p.read_text()]


def place(client: Any, hold_id: int, **body: Any) -> Any:
    hold = {"id": hold_id, "guest_email": f"guest-{hold_id}@example.com", "nights": 2, **body}
    return client.post("/holds", hold, content_type="application/json")


# Tasks of the tests' own, declared on the project's box as any app's tasks.py would.


@box.task(key="test-write-then-fail/hold-{hold_id}", retry=ONCE)
def write_then_fail(ctx: JobContext, hold_id: int) -> None:
    HoldEvent.objects.create(hold_id=hold_id, what="half-done")
    ctx.outbox.email(to="nobody@example.com", subject="never", text="never sent")
    raise RuntimeError("the report service is down")


@box.task(key="test-commit/hold-{hold_id}", retry=ONCE)
def commit_midway(ctx: JobContext, hold_id: int) -> None:
    HoldEvent.objects.create(hold_id=hold_id, what="before commit")
    transaction.commit()


@box.task(key="test-close/hold-{hold_id}", retry=ONCE)
def close_midway(ctx: JobContext, hold_id: int) -> None:
    HoldEvent.objects.create(hold_id=hold_id, what="before close")
    connection.close()


@box.task(key="test-autocommit/hold-{hold_id}", retry=ONCE)
def autocommit_midway(ctx: JobContext, hold_id: int) -> None:
    HoldEvent.objects.create(hold_id=hold_id, what="before autocommit")
    transaction.set_autocommit(True)


@box.task(key="test-durable/hold-{hold_id}", retry=ONCE)
def durable_block(ctx: JobContext, hold_id: int) -> None:
    with transaction.atomic(durable=True):
        HoldEvent.objects.create(hold_id=hold_id, what="in a durable block")


@box.task(key="test-on-commit/hold-{hold_id}", retry=ONCE)
def after_commit(ctx: JobContext, hold_id: int) -> None:
    transaction.on_commit(lambda: None)


@box.task(key="test-nested/hold-{hold_id}", retry=ONCE)
def nested(ctx: JobContext, hold_id: int) -> None:
    HoldEvent.objects.create(hold_id=hold_id, what="kept")
    try:
        with transaction.atomic():
            HoldEvent.objects.create(hold_id=hold_id, what="undone")
            raise ValueError("inner block fails")
    except ValueError:
        pass


@box.task(key="test-follow-up/hold-{hold_id}", retry=ONCE)
def follow_up(ctx: JobContext, hold_id: int) -> None:
    HoldEvent.objects.create(hold_id=hold_id, what="followed up")


@box.task(key="test-chain/hold-{hold_id}", retry=ONCE)
def chain(ctx: JobContext, hold_id: int, fail: bool) -> None:
    box.enqueue(follow_up, hold_id=hold_id)  # inside a handler: in the claim's transaction
    if fail:
        raise RuntimeError("after the follow-up was enqueued")


@box.task(key="test-after-atomic/hold-{hold_id}", retry=ONCE)
def after_atomic(ctx: JobContext, hold_id: int) -> None:
    """An ORM call that opens and closes an atomic block, then a follow-up, then a failure."""
    HoldEvent.objects.get_or_create(hold_id=hold_id, what="after atomic")
    list(Hold.objects.filter(pk=hold_id).iterator())  # chunked reads on the claim's cursor
    box.enqueue(follow_up, hold_id=hold_id)
    raise RuntimeError("after the follow-up was enqueued")


@box.task(key="test-caught/hold-{hold_id}", retry=ONCE)
def caught(ctx: JobContext, hold_id: int) -> None:
    HoldEvent.objects.create(hold_id=hold_id, what="before the error")
    with suppress(IntegrityError):  # and carries on: Django marked the transaction for rollback
        Hold.objects.create(pk=hold_id, guest_email="g@example.com", nights=1)  # taken


def test_an_atomic_block_in_a_handler_leaves_the_claim_in_force():
    Hold.objects.create(pk=116, guest_email="g@example.com", nights=1)
    box.enqueue(after_atomic, hold_id=116)
    drain(box, raise_on_failure=False)
    assert box.store.job_find_by_key("test-after-atomic/hold-116")[0].state == "dead"
    assert box.store.job_find_by_key("test-follow-up/hold-116") == []
    assert not HoldEvent.objects.filter(hold_id=116).exists()


def test_a_handler_that_carries_on_after_a_database_error_fails_and_keeps_nothing():
    Hold.objects.create(pk=117, guest_email="g@example.com", nights=1)
    box.enqueue(caught, hold_id=117)
    drain(box, raise_on_failure=False)
    assert box.store.job_find_by_key("test-caught/hold-117")[0].state == "dead"
    assert not HoldEvent.objects.filter(hold_id=117).exists()


def test_a_handler_enqueues_its_follow_up_in_the_claims_transaction():
    for hold_id in (114, 115):
        Hold.objects.create(pk=hold_id, guest_email="g@example.com", nights=1)
    box.enqueue(chain, hold_id=114, fail=False)
    box.enqueue(chain, hold_id=115, fail=True)
    drain(box, raise_on_failure=False)
    assert HoldEvent.objects.filter(hold_id=114, what="followed up").count() == 1
    assert box.store.job_find_by_key("test-follow-up/hold-115") == []


def test_a_hold_expires_once_and_its_guest_is_emailed_once(client):
    with FrozenClock(box, at=T0) as clock:
        placed = place(client, 101)
        assert placed.status_code == 201
        drain(box)
        assert Hold.objects.get(pk=101).state == "held"  # not due for fifteen minutes
        clock.advance(HOLD_FOR + timedelta(seconds=1))
        drain(box)
        again = box.enqueue(expire_hold, hold_id=101)  # a bug's, or an operator's, second go
        drain(box)
    assert (again.created, again.reason) == (False, "key_claimed")
    assert Hold.objects.get(pk=101).state == "expired"
    assert list(HoldEvent.objects.filter(hold_id=101).values_list("what", flat=True)) == ["expired"]
    assert len(emails_to("guest-101@example.com")) == 1
    assert client.get("/holds/101").json()["emails"] == ["sent"]


def test_a_request_refused_after_its_enqueue_leaves_no_hold_and_no_job(client):
    refused = place(client, 102, nights=40)
    assert refused.status_code == 422
    assert not Hold.objects.filter(pk=102).exists()
    assert box.store.job_find_by_key("hold-expired/hold-102") == []


def test_a_retried_request_places_one_hold_and_one_expiry(client):
    assert place(client, 103).status_code == 201
    assert place(client, 103).status_code == 409  # the client timed out and tried again
    assert len(box.store.job_find_by_key("hold-expired/hold-103")) == 1


def test_outside_atomic_an_enqueue_commits_at_once():
    """Autocommit, as Django's connection is outside `atomic`: what fails afterwards cannot take
    the job back."""
    with pytest.raises(RuntimeError):
        box.enqueue(expire_hold, hold_id=104)
        raise RuntimeError("the view failed after its enqueue")
    assert len(box.store.job_find_by_key("hold-expired/hold-104")) == 1


def test_a_handler_that_fails_after_writing_models_leaves_no_rows_no_intent_no_message():
    Hold.objects.create(pk=105, guest_email="g@example.com", nights=1)
    box.enqueue(write_then_fail, hold_id=105)
    drain(box, raise_on_failure=False)
    [job] = box.store.job_find_by_key("test-write-then-fail/hold-105")
    assert job.state == "dead"
    assert not HoldEvent.objects.filter(hold_id=105).exists()
    chain = receipt_chain(box.store, "test-write-then-fail/hold-105")
    assert chain.intent is None and chain.messages == []
    assert emails_to("nobody@example.com") == []


@pytest.mark.parametrize(
    ("task", "prefix", "hold_id"),
    [
        (commit_midway, "test-commit", 106),
        (close_midway, "test-close", 107),
        (after_commit, "test-on-commit", 108),
        (autocommit_midway, "test-autocommit", 113),
        (durable_block, "test-durable", 118),
    ],
)
def test_calls_that_would_end_the_claims_transaction_are_refused(task, prefix, hold_id):
    Hold.objects.create(pk=hold_id, guest_email="g@example.com", nights=1)
    box.enqueue(task, hold_id=hold_id)
    drain(box, raise_on_failure=False)
    [job] = box.store.job_find_by_key(f"{prefix}/hold-{hold_id}")
    assert job.state == "dead"
    error = box.store.job_attempt_list(job.id)[0].error or ""
    assert any(word in error for word in ("forbidden", "may not", "on_commit", "durable")), error
    assert not HoldEvent.objects.filter(hold_id=hold_id).exists()


def test_an_atomic_block_in_a_handler_is_a_savepoint_inside_the_claim():
    Hold.objects.create(pk=109, guest_email="g@example.com", nights=1)
    box.enqueue(nested, hold_id=109)
    drain(box)
    assert list(HoldEvent.objects.filter(hold_id=109).values_list("what", flat=True)) == ["kept"]


def test_in_one_batch_a_failing_handler_undoes_only_its_own_model_writes():
    for hold_id in (110, 111):
        Hold.objects.create(pk=hold_id, guest_email=f"guest-{hold_id}@example.com", nights=1)
    with FrozenClock(box, at=T0):
        box.enqueue_many(write_then_fail, [{"hold_id": 110}])
        box.enqueue_many(expire_hold, [{"hold_id": 111}])
        drain(box, raise_on_failure=False)
    assert box.store.job_find_by_key("test-write-then-fail/hold-110")[0].state == "dead"
    assert Hold.objects.get(pk=111).state == "expired"
    events = HoldEvent.objects.filter(hold_id__in=(110, 111))
    assert list(events.values_list("what", flat=True)) == ["expired"]


def test_the_drain_leaves_the_tests_own_connection_usable():
    Hold.objects.create(pk=112, guest_email="g@example.com", nights=1)
    box.enqueue(expire_hold, hold_id=112)
    drain(box)
    with transaction.atomic():  # the test thread's own connection, not the handler's
        Hold.objects.filter(pk=112).update(nights=3)
    assert Hold.objects.get(pk=112).nights == 3
