"""The store's clock, on every store: `oncebox_now()` is the real time, or a frozen or offset
instant every connection and process of the database shares — what tests and the chaos harness
move instead of sleeping. A setting carries its owner, lapses by itself past its expiry, and an
operator's change of it is audited."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.kernel.clock import ClockSetting, process_owner, real_now
from oncebox.store import open_store
from oncebox.store.params import Audit, AuditFilter, JobFilter
from oncebox.store.protocol import Store
from support.contract import T0, job

SLACK = timedelta(seconds=5)  # the database server and this host, read a moment apart


def test_a_frozen_clock_is_what_every_operation_and_every_store_on_the_database_reads(
    store: Store,
):
    at = T0 + timedelta(days=100, microseconds=7)
    store.clock_set(ClockSetting(frozen_at=at))
    setting = store.clock_get()
    assert (setting.frozen_at, setting.offset, setting.owner) == (at, None, process_owner())
    assert store.clock_now() == at
    job_id, _created = store.job_insert(job())
    assert [(j.id, j.created_at) for j in store.job_list(JobFilter())] == [(job_id, at)]
    other = open_store(store.url)
    try:
        assert (other.clock_get().frozen_at, other.clock_now()) == (at, at)
    finally:
        other.close()


def test_an_offset_clock_runs_at_real_speed_from_elsewhere(store: Store):
    store.clock_set(ClockSetting(offset=timedelta(days=-400), owner="harness:1"))
    setting = store.clock_get()
    assert (setting.frozen_at, setting.offset, setting.owner) == (
        None,
        timedelta(days=-400),
        "harness:1",
    )
    before = real_now()
    now = store.clock_now()
    after = real_now()
    assert before - timedelta(days=400) - SLACK <= now <= after - timedelta(days=400) + SLACK


def test_resetting_the_clock_gives_back_the_real_time(store: Store):
    store.clock_set(ClockSetting())
    assert store.clock_get().is_real
    assert abs(store.clock_now() - real_now()) < SLACK
    job_id, _created = store.job_insert(job())
    created = store.job_get(job_id)
    assert created is not None and abs(created.created_at - real_now()) < SLACK


def test_a_setting_past_its_expiry_lapses_to_the_real_time_by_itself(store: Store):
    """A test or a demo killed while it held the clock cannot leave the database frozen."""
    store.clock_set(ClockSetting(frozen_at=T0, expires_at=real_now() + timedelta(hours=1)))
    assert (store.clock_get().lapsed, store.clock_now()) == (False, T0)
    store.clock_set(ClockSetting(frozen_at=T0, expires_at=real_now() - timedelta(seconds=1)))
    lapsed = store.clock_get()
    assert (lapsed.frozen_at, lapsed.lapsed, lapsed.is_real) == (T0, True, True)
    assert abs(store.clock_now() - real_now()) < SLACK


def test_an_operators_clock_change_is_audited_with_what_the_clock_was(store: Store):
    store.clock_set(ClockSetting(), Audit("ops-alice", "a stray test clock"))
    assert store.clock_get().is_real
    [audit] = store.audit_search(AuditFilter(action="clock-reset"))
    assert (audit.actor, audit.reason, audit.target_kind) == (
        "ops-alice",
        "a stray test clock",
        "clock",
    )
    was = json.loads(audit.details or "{}")["was"]
    assert was.startswith(f"frozen at {T0.isoformat()} by {process_owner()}"), was
    assert abs(audit.at - real_now()) < SLACK
