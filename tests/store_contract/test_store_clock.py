"""The store's clock, on every store: `oncebox_now()` is the real time, or a frozen or offset
instant every connection and process of the database shares — what tests and the chaos harness
move instead of sleeping."""

from __future__ import annotations

from datetime import timedelta

from oncebox.clock import ClockSetting, real_now
from oncebox.store import open_store
from oncebox.store.base import JobFilter, Store
from support.contract import T0, job


def test_a_frozen_clock_is_what_every_operation_and_every_store_on_the_database_reads(
    store: Store,
):
    at = T0 + timedelta(days=100, microseconds=7)
    store.clock_set(ClockSetting(frozen_at=at))
    assert store.clock_get() == ClockSetting(frozen_at=at)
    assert store.clock_now() == at
    job_id, _created = store.job_insert(job())
    assert [(j.id, j.created_at) for j in store.job_list(JobFilter())] == [(job_id, at)]
    other = open_store(store.url)
    try:
        assert (other.clock_get(), other.clock_now()) == (ClockSetting(frozen_at=at), at)
    finally:
        other.close()


def test_an_offset_clock_runs_at_real_speed_from_elsewhere(store: Store):
    store.clock_set(ClockSetting(offset=timedelta(days=-400)))
    assert store.clock_get() == ClockSetting(offset=timedelta(days=-400))
    before = real_now()
    now = store.clock_now()
    after = real_now()
    slack = timedelta(seconds=5)  # the database server and this host, read a moment apart
    assert before - timedelta(days=400) - slack <= now <= after - timedelta(days=400) + slack


def test_resetting_the_clock_gives_back_the_real_time(store: Store):
    store.clock_set(ClockSetting())
    assert store.clock_get().is_real
    slack = timedelta(seconds=5)
    assert abs(store.clock_now() - real_now()) < slack
    job_id, _created = store.job_insert(job())
    created = store.job_get(job_id)
    assert created is not None and abs(created.created_at - real_now()) < slack
