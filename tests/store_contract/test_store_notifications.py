"""Waking idle workers, on every store: `wait_for_jobs` returns as soon as work may have
arrived (a NOTIFY on PostgreSQL, a commit seen in the files on SQLite), and times out when
nothing happened; `notify_jobs` wakes them for rows that became ready without an insert."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from oncebox.store import Store, open_store
from oncebox.store.base import JobReleaseParams
from support.contract import insert, lease, opened_session
from support.waiting import TIMEOUT


@pytest.fixture
def waiter(store: Store) -> Iterator[Store]:
    """Another store on the same database, as an idle worker's."""
    opened = open_store(store.url)
    try:
        yield opened
    finally:
        opened.close()


def woken_by(store: Store, write: Callable[[], object]) -> bool:
    """Whether `store` (an idle worker's), having looked once (so only what follows is news),
    wakes while another thread runs `write`."""
    store.wait_for_jobs(0)  # listening from now on (PostgreSQL); the files as they are (SQLite)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        return store.wait_for_jobs(TIMEOUT)
    finally:
        writer.join(TIMEOUT)


def test_wait_for_jobs_times_out_when_nothing_happened(store: Store):
    store.wait_for_jobs(0)
    assert store.wait_for_jobs(0.2) is False
    assert store.job_count_by_state().counts == {}


def test_wait_for_jobs_wakes_when_another_store_inserts_a_job(store: Store, waiter: Store):
    assert woken_by(waiter, lambda: insert(store, "k/1")) is True
    assert store.job_count_by_state().counts == {"ready": 1}


def test_notify_jobs_wakes_waiters_for_rows_made_ready_without_an_insert(
    store: Store, waiter: Store
):
    job_id = insert(store, "k/1")
    with opened_session(store) as session:
        token, _ids = lease(session)

        def release_and_notify() -> None:
            assert session.job_release(JobReleaseParams([job_id], token)) == 1
            store.notify_jobs()

        assert woken_by(waiter, release_and_notify) is True
    assert store.job_count_by_state().counts == {"ready": 1}  # notifying wrote nothing
