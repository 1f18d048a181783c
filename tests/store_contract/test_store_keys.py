"""The key-drift guard's records, operation by operation, on every store: each task's key
template and each schedule's period function leave one canary, recorded once, replaced only by an
audited acceptance."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.store.params import AuditFilter, KeyCanary
from oncebox.store.protocol import Store
from support.contract import T0, advance

DIGEST = KeyCanary("task", "weekly_digest", "digest/{customer}/{period}", ("digest/1/W1",))
WEEKLY = KeyCanary("schedule", "weekly", "iso_week", ("2026-W01", "2026-W53"))


def test_key_canary_record_keeps_the_first_record_of_a_task_or_schedule(store: Store):
    stored = store.key_canary_record(DIGEST)
    assert stored == KeyCanary(DIGEST.kind, DIGEST.name, DIGEST.source, DIGEST.outputs, T0)
    advance(store, timedelta(days=1))
    drifted = KeyCanary("task", "weekly_digest", "digest/{period}/{customer}", ("digest/W1/1",))
    assert store.key_canary_record(drifted) == stored  # a second record changes nothing
    assert store.key_canary_get("task", "weekly_digest") == stored


def test_key_canary_get_reads_one_canary_by_kind_and_name(store: Store):
    store.key_canary_record(DIGEST)
    store.key_canary_record(WEEKLY)
    weekly = store.key_canary_get("schedule", "weekly")
    assert weekly is not None and (weekly.source, weekly.outputs) == (WEEKLY.source, WEEKLY.outputs)
    assert store.key_canary_get("schedule", "weekly_digest") is None  # a task of that name
    assert store.key_canary_get("task", "unknown") is None


def test_key_canary_list_lists_every_canary_by_kind_then_name(store: Store):
    for canary in (WEEKLY, DIGEST, KeyCanary("task", "expire_hold", "hold/{id}", ("hold/1",))):
        store.key_canary_record(canary)
    assert [(c.kind, c.name) for c in store.key_canary_list()] == [
        ("schedule", "weekly"),
        ("task", "expire_hold"),
        ("task", "weekly_digest"),
    ]
    assert all(c.recorded_at == T0 for c in store.key_canary_list())


def test_key_canary_accept_replaces_the_record_and_audits_what_it_was(store: Store):
    store.key_canary_record(DIGEST)
    advance(store, timedelta(hours=3))
    changed = KeyCanary("task", "weekly_digest", "digest/c-{customer}/{period}", ("digest/c-1/W1",))
    audit_id = store.key_canary_accept(changed, "ops-alice", "renamed the customer segment")
    assert store.key_canary_get("task", "weekly_digest") == KeyCanary(
        changed.kind, changed.name, changed.source, changed.outputs, T0 + timedelta(hours=3)
    )
    [audit] = store.audit_search(AuditFilter(action="accept-keys"))
    assert (audit.id, audit.target_kind, audit.target_key, audit.actor, audit.reason) == (
        audit_id,
        "task",
        "weekly_digest",
        "ops-alice",
        "renamed the customer segment",
    )
    assert json.loads(audit.details or "{}") == {
        "was": DIGEST.source,
        "was_outputs": list(DIGEST.outputs),
        "now": changed.source,
        "now_outputs": list(changed.outputs),
    }


def test_key_canary_accept_records_a_canary_never_seen_before(store: Store):
    audit_id = store.key_canary_accept(WEEKLY, "ops", "first deploy of the schedule")
    assert store.key_canary_get("schedule", "weekly") == KeyCanary(
        WEEKLY.kind, WEEKLY.name, WEEKLY.source, WEEKLY.outputs, T0
    )
    [audit] = store.audit_list()
    assert audit.id == audit_id
    details = json.loads(audit.details or "{}")
    assert (details["was"], details["was_outputs"], details["now"]) == (None, None, "iso_week")
