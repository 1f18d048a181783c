"""Waking idle workers, on every store: `wait_for_work` returns as soon as work may have arrived
(a NOTIFY on PostgreSQL, a commit seen in the files on SQLite) with the kinds it may be, and
times out when nothing happened; `notify_work` wakes them for rows that became ready without an
insert. PostgreSQL tells jobs from outbox rows by the NOTIFY's channel, so a worker wakes only
the lanes that have something to look at; SQLite cannot tell, and wakes every lane."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from oncebox.store import Store, open_store
from oncebox.store.params import EVERY_KIND, JobReleaseParams, OperatorAction, WorkKind
from support.contract import (
    ambiguous,
    insert,
    lease,
    opened_session,
    outbox_insert,
    write_outbox,
)
from support.waiting import TIMEOUT


@pytest.fixture
def waiter(store: Store) -> Iterator[Store]:
    """Another store on the same database, as an idle worker's."""
    opened = open_store(store.url)
    try:
        yield opened
    finally:
        opened.close()


def woken_by(store: Store, write: Callable[[], object]) -> frozenset[WorkKind]:
    """The kinds `store` (an idle worker's), having looked once (so only what follows is news),
    is woken with while another thread runs `write`."""
    store.wait_for_work(0)  # listening from now on (PostgreSQL); the files as they are (SQLite)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        return store.wait_for_work(TIMEOUT)
    finally:
        writer.join(TIMEOUT)


def only(store: Store, kind: WorkKind) -> frozenset[WorkKind]:
    return frozenset((kind,)) if store.dialect == "postgres" else EVERY_KIND


def test_wait_for_work_times_out_when_nothing_happened(store: Store):
    store.wait_for_work(0)
    assert store.wait_for_work(0.2) == frozenset()
    assert store.job_count_by_state().counts == {}


def test_a_job_inserted_by_another_store_wakes_the_job_lanes(store: Store, waiter: Store):
    assert woken_by(waiter, lambda: insert(store, "k/1")) == only(store, "jobs")
    assert store.job_count_by_state().counts == {"ready": 1}


def test_an_outbox_row_written_by_another_store_wakes_the_outbox_lanes(store: Store, waiter: Store):
    assert woken_by(waiter, lambda: write_outbox(store, outbox_insert("m/1"))) == only(
        store, "outbox"
    )
    assert store.outbox_count_by_state().counts == {"pending": 1}


def test_notify_work_wakes_waiters_for_rows_made_ready_without_an_insert(
    store: Store, waiter: Store
):
    job_id = insert(store, "k/1")
    with opened_session(store) as session:
        token, _ids = lease(session)

        def release_and_notify() -> None:
            assert session.job_release(JobReleaseParams([(job_id, 1)], token)) == 1
            store.notify_work("jobs")

        assert woken_by(waiter, release_and_notify) == only(store, "jobs")
    assert store.job_count_by_state().counts == {"ready": 1}  # notifying wrote nothing


def test_notify_work_for_the_outbox_wakes_the_outbox_lanes_only(store: Store, waiter: Store):
    if store.dialect == "sqlite":
        # nothing to send: it writes nothing, so an idle worker sees no change (asked with a short
        # wait, not the full timeout a wake-up is given: nothing is on its way)
        waiter.wait_for_work(0)
        store.notify_work("outbox")
        assert waiter.wait_for_work(0.2) == frozenset()
        return
    assert woken_by(waiter, lambda: store.notify_work("outbox")) == only(store, "outbox")


def test_a_resend_resolution_wakes_the_outbox_lanes(store: Store, waiter: Store):
    """A held send resolved "resend" is pending again without an insert: idle dispatchers are
    told, instead of finding it at their poll interval."""
    outbox_id = ambiguous(store)
    action = OperatorAction(outbox_id, "ops", "not received")
    assert woken_by(waiter, lambda: store.outbox_resolve(action, "resend", None)) == only(
        store, "outbox"
    )
    assert store.outbox_count_by_state().counts == {"pending": 1}
