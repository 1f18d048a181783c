"""A store's schema and lifetime, on every store: which dialect it speaks, which migrations it
knows and has applied, migrating an empty database, and closing without losing a write."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from oncebox.kernel.errors import StoreReplaced
from oncebox.store import open_store
from oncebox.store.protocol import Store
from support.contract import job


def test_a_store_names_its_dialect_and_how_idle_workers_learn_of_new_jobs(
    store: Store,
):
    assert store.dialect == ("sqlite" if store.url.startswith("sqlite:") else "postgres")
    assert store.supports_notifications is True  # a NOTIFY, or a commit seen in the files


def test_a_migrated_store_has_applied_every_migration_it_knows(store: Store):
    status = store.schema_status()
    assert status.known and status.applied == status.known
    assert (status.missing, status.unknown, status.current) == ((), (), status.required)
    assert store.schema_migrate() == []  # nothing left to apply
    assert store.schema_status() == status


def empty_database_url(store: Store, tmp_path: Path) -> str:
    """A database beside `store`'s with no oncebox tables: a new SQLite file, or a new schema
    of the PostgreSQL database."""
    if store.dialect == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return f"{store.url}?schema=contract_empty_{uuid.uuid4().hex[:8]}"


def test_schema_migrate_applies_every_migration_to_an_empty_database_once(
    store: Store, tmp_path: Path
):
    empty = open_store(empty_database_url(store, tmp_path), migrate=False)
    try:
        before = empty.schema_status()
        assert before.applied == () and before.missing == before.known
        assert empty.schema_migrate() == list(before.known)
        after = empty.schema_status()
        assert (after.applied, after.missing) == (before.known, ())
        assert empty.schema_migrate() == []
        job_id, created = empty.job_insert(job("k/in-the-new-schema"))
        assert created and empty.job_get(job_id) is not None
    finally:
        empty.close()
    assert store.job_find_by_key("k/in-the-new-schema") == []  # another database altogether


def test_closing_a_store_keeps_what_it_committed(store: Store):
    job_id, _created = store.job_insert(job("k/1"))
    store.close()
    store.close()  # closing twice is harmless
    again = open_store(store.url)
    try:
        found = again.job_get(job_id)
        assert found is not None and (found.key, found.state) == ("k/1", "ready")
    finally:
        again.close()


def test_check_identity_holds_while_the_database_is_the_one_opened(store: Store, tmp_path: Path):
    store.check_identity()  # nothing moved: no error, on either store
    if store.dialect == "postgres":
        return  # a server's database is reached by name: it cannot be swapped under the store
    path = Path(store.url.removeprefix("sqlite:///"))
    replacement = tmp_path / "restored.db"
    open_store(f"sqlite:///{replacement}").close()
    replacement.replace(path)
    with pytest.raises(StoreReplaced, match=f"{path} was replaced"):
        store.check_identity()
    reopened = open_store(store.url)  # the new file opens normally
    try:
        assert reopened.schema_status().applied
    finally:
        reopened.close()
