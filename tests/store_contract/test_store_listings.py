"""Listings by key prefix: the operator's "show me this customer's rows" (the console's filters)."""

from __future__ import annotations

from oncebox.store.params import JobFilter, OutboxFilter
from oncebox.store.protocol import Store
from support.contract import insert, outbox_insert, write_outbox


def test_job_list_takes_the_keys_that_start_with_a_prefix_newest_first(store: Store):
    ids = {key: insert(store, key) for key in ["digest/c-1/w1", "digest/c-1/w2", "digest/c-10/w1"]}
    listed = store.job_list(JobFilter(key_prefix="digest/c-1/"))
    assert [j.key for j in listed] == ["digest/c-1/w2", "digest/c-1/w1"]
    assert [j.id for j in store.job_list(JobFilter(key_prefix="digest/c-1"))] == sorted(
        ids.values(), reverse=True
    )  # a prefix is a prefix: c-10 starts with c-1 too
    assert store.job_list(JobFilter(key_prefix="nobody/")) == []
    assert store.job_list(JobFilter(key_prefix="digest/c-1/w")) == listed  # and "digest/c-1/x"?
    # the range stops right after the prefix: a key one past it is not taken
    insert(store, "digest/c-1/x")
    assert [j.key for j in store.job_list(JobFilter(key_prefix="digest/c-1/w"))] == [
        "digest/c-1/w2",
        "digest/c-1/w1",
    ]


def test_outbox_list_takes_the_messages_whose_key_starts_with_a_prefix(store: Store):
    write_outbox(store, outbox_insert("digest/c-1/w1"), outbox_insert("digest/c-2/w1"))
    [row] = store.outbox_list(OutboxFilter(key_prefix="digest/c-2/"))
    assert row.key == "digest/c-2/w1"
    assert len(store.outbox_list(OutboxFilter(key_prefix="digest/"))) == 2
