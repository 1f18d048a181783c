"""The audit log, read back on every store: every operator action leaves one row, newest
first, found by target, action or key, paged by id; an entry of no row's (a refused login) is
appended at the store's time."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.store.params import Audit, AuditEntry, AuditFilter, OperatorAction
from oncebox.store.protocol import Store
from support.contract import T0, advance, dead_job, insert


def actions(store: Store) -> tuple[int, int]:
    """Four audited actions, one a minute: cancel job 1, replay job 2, pause and resume."""
    cancelled = insert(store, "k/1")
    store.job_cancel(OperatorAction(cancelled, "ops-a", "duplicate order"))
    advance(store, timedelta(minutes=1))
    replayed = dead_job(store, "k/2")
    store.job_replay(OperatorAction(replayed, "ops-b", "fixed"))
    advance(store, timedelta(minutes=1))
    store.schedule_state_pause("weekly", True, Audit("ops-a", "holiday"))
    advance(store, timedelta(minutes=1))
    store.schedule_state_pause("weekly", False, Audit("ops-a", "back"))
    return cancelled, replayed


def test_audit_list_is_every_action_newest_first_or_one_targets(store: Store):
    cancelled, replayed = actions(store)
    everything = store.audit_list()
    assert [(a.action, a.target_id, a.target_key, a.at) for a in everything] == [
        ("resume", None, "weekly", T0 + timedelta(minutes=3)),
        ("pause", None, "weekly", T0 + timedelta(minutes=2)),
        ("replay", replayed, "k/2", T0 + timedelta(minutes=1)),
        ("cancel", cancelled, "k/1", T0),
    ]
    assert [a.id for a in everything] == sorted((a.id for a in everything), reverse=True)
    assert [a.action for a in store.audit_list(cancelled)] == ["cancel"]
    assert [a.action for a in store.audit_list(limit=2)] == ["resume", "pause"]
    assert store.audit_list(target_id=10**9) == []


def test_audit_search_filters_by_action_key_and_pages_by_id(store: Store):
    cancelled, _replayed = actions(store)
    assert [a.target_id for a in store.audit_search(AuditFilter(action="cancel"))] == [cancelled]
    by_key = store.audit_search(AuditFilter(key="weekly"))
    assert [(a.action, a.actor, a.reason) for a in by_key] == [
        ("resume", "ops-a", "back"),
        ("pause", "ops-a", "holiday"),
    ]
    newest = store.audit_search(AuditFilter(limit=1))
    older = store.audit_search(AuditFilter(before_id=newest[0].id, limit=2))
    assert [a.action for a in newest + older] == ["resume", "pause", "replay"]
    assert store.audit_search(AuditFilter(target_id=cancelled, action="replay")) == []


def test_audit_append_writes_an_entry_of_no_row_at_the_stores_time(store: Store):
    advance(store, timedelta(minutes=5))
    details = json.dumps({"why": "wrong-password", "name": "vic", "refusals": 1})
    first = store.audit_append(
        AuditEntry("203.0.113.9", "login-refused", "login", "wrong password for 'vic'", details)
    )
    second = store.audit_append(AuditEntry("console", "login-refused", "login", "summary"))
    assert second > first
    entries = store.audit_search(AuditFilter(action="login-refused"))
    assert [(a.id, a.at, a.actor, a.target_kind, a.target_id, a.target_key) for a in entries] == [
        (second, T0 + timedelta(minutes=5), "console", "login", None, None),
        (first, T0 + timedelta(minutes=5), "203.0.113.9", "login", None, None),
    ]
    assert json.loads(entries[1].details or "") == json.loads(details)
    assert entries[0].details is None and entries[1].reason == "wrong password for 'vic'"
