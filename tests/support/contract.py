"""Building blocks for the store contract (`tests/store_contract/test_store_*.py`).

Each contract test calls the operation it pins itself; what it needs around it — a job in some
state, an outbox row, a lease — is made here, through the store's own operations, so a test
reads as the operations it is about. Time is the store's clock, frozen at `T0` by the `store`
fixture and moved with `advance`; nothing here sleeps.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from oncebox.kernel.clock import ClockSetting
from oncebox.outbox.transitions import OutboxFinish
from oncebox.store.params import (
    ConsumerSettings,
    IntentClaim,
    JobFinish,
    JobInsert,
    JobLeaseParams,
    LimitPlan,
    OutboxInsert,
    OutboxLeaseParams,
)
from oncebox.store.protocol import ConsumerSession, Store
from oncebox.store.records import JobRow, OutboxLeased, OutboxRow

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)  # a Monday, 09:00 UTC
LEASE = timedelta(seconds=30)
SETTINGS = ConsumerSettings(
    lock_timeout=timedelta(seconds=5), transaction_timeout=timedelta(seconds=60)
)


def advance(store: Store, by: timedelta) -> datetime:
    """Move the store's frozen clock on by `by`; returns the new instant."""
    now = store.clock_now() + by
    store.clock_set(ClockSetting(frozen_at=now))
    return now


def new_token() -> str:
    """A lease token (a UUID: PostgreSQL keeps lease tokens as uuid)."""
    return str(uuid.uuid4())


JOB_FIELDS: dict[str, Any] = {
    "queue": "default",
    "priority": 0,
    "group_key": None,
    "max_attempts": 3,
}


def job(
    key: str | None = "k/1", task: str = "t", *, args: dict[str, Any] | None = None, **fields: Any
) -> JobInsert:
    """One job of `task` under `key`; `fields` set any other JobInsert field (queue, priority,
    group_key, max_attempts, run_at, delay, max_age)."""
    arguments = json.dumps({"n": 1} if args is None else args)
    return JobInsert(task=task, key=key, args_json=arguments, **{**JOB_FIELDS, **fields})


def insert(store: Store, key: str | None = "k/1", task: str = "t", **fields: Any) -> int:
    """Insert one job that must be created; returns its id."""
    job_id, created = store.job_insert(job(key, task, **fields))
    assert created, f"job {key!r} was not created"
    return job_id


def row(store: Store, job_id: int) -> JobRow:
    found = store.job_get(job_id)
    assert found is not None, f"no job {job_id}"
    return found


def message(store: Store, outbox_id: int) -> OutboxRow:
    found = store.outbox_get(outbox_id)
    assert found is not None, f"no outbox row {outbox_id}"
    return found


@contextmanager
def opened_session(store: Store) -> Iterator[ConsumerSession]:
    session = store.consumer_session(SETTINGS)
    try:
        yield session
    finally:
        session.close()


def lease_params(
    *,
    tasks: Sequence[str] = ("t",),
    queues: Sequence[str] = ("default",),
    limit: int = 10,
    worker: str = "w1",
    token: str | None = None,
    lease_for: timedelta = LEASE,
    limits: LimitPlan | None = None,
) -> JobLeaseParams:
    return JobLeaseParams(
        tasks=tasks,
        queues=queues,
        limit=limit,
        worker=worker,
        token=token or new_token(),
        lease_for=lease_for,
        limits=limits,
    )


def lease(session: ConsumerSession, **params: Any) -> tuple[str, list[int]]:
    """Lease what is due under a fresh token; returns the token and the leased ids."""
    wanted = lease_params(**params)
    leased = session.job_lease(wanted)
    return wanted.token, [j.id for j in leased]


def settle(store: Store, job_id: int, finish: JobFinish, task: str = "t") -> None:
    """Lease job `job_id` (it must be the only due job of `task`) and settle it as `finish`."""
    with opened_session(store) as session:
        token, ids = lease(session, tasks=(task,))
        assert ids == [job_id], ids
        with session.transaction() as tx:
            assert tx.job_finish(token, [finish]) == {job_id}


def dead_job(store: Store, key: str = "k/dead", task: str = "t") -> int:
    """A job that died on its first attempt."""
    job_id = insert(store, key, task)
    settle(store, job_id, JobFinish(job_id, "dead", error="boom"), task)
    return job_id


def done_job(store: Store, key: str = "k/done", task: str = "t") -> int:
    """A job completed on its first attempt, with its intent claimed."""
    job_id = insert(store, key, task)
    with opened_session(store) as session:
        token, ids = lease(session, tasks=(task,))
        assert ids == [job_id], ids
        with session.transaction() as tx:
            assert tx.intent_claim([IntentClaim(key, task, job_id)]) == {key}
            tx.job_finish(token, [JobFinish(job_id, "done", outcome="completed")])
    return job_id


def outbox_insert(
    key: str,
    *,
    channel: str = "email",
    intent_key: str | None = None,
    payload: dict[str, object] | None = None,
    job_id: int | None = None,
) -> OutboxInsert:
    return OutboxInsert(
        key=key,
        intent_key=intent_key or key,
        channel=channel,
        payload_json=json.dumps(payload if payload is not None else {"to": ["a@b.example"]}),
        token=f"token-of-{key}",
        job_id=job_id,
    )


def write_outbox(store: Store, *rows: OutboxInsert) -> list[int]:
    """Write outbox rows as a handler's consumer transaction does; returns their ids."""
    with opened_session(store) as session, session.transaction() as tx:
        tx.outbox_insert(rows)
    found = {r.key: r.id for r in (m for i in rows for m in store.outbox_find_by_key(i.key))}
    return [found[r.key] for r in rows]


def outbox_lease_params(
    *,
    channels: Sequence[str] = ("email",),
    limit: int = 10,
    worker: str = "d1",
    token: str | None = None,
    lease_for: timedelta = LEASE,
) -> OutboxLeaseParams:
    return OutboxLeaseParams(
        channels=channels,
        limit=limit,
        worker=worker,
        token=token or new_token(),
        lease_for=lease_for,
    )


def lease_outbox(store: Store, **params: Any) -> list[OutboxLeased]:
    return store.outbox_lease(outbox_lease_params(**params))


def finish_outbox(store: Store, outbox_id: int, finish: OutboxFinish) -> None:
    """Lease row `outbox_id` (the first due one of its channel) and settle it as `finish`."""
    [leased] = lease_outbox(store, channels=(message(store, outbox_id).channel,), limit=1)
    assert leased.id == outbox_id
    assert store.outbox_finish(leased.lease_token, [finish]) == {outbox_id}


def ambiguous(store: Store, key: str = "k/1") -> int:
    """An outbox row held ambiguous, as a send with an unknown outcome leaves it."""
    [outbox_id] = write_outbox(store, outbox_insert(key))
    finish_outbox(
        store,
        outbox_id,
        OutboxFinish(outbox_id, "ambiguous", "ambiguous", True, error="timeout", uncertain=True),
    )
    return outbox_id
