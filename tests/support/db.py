"""Raw SQL against a box's database, for tests that check business rows beside oncebox's own."""

from __future__ import annotations

from typing import Any

import psycopg

from oncebox import Box
from oncebox.store.postgres import PostgresStore
from oncebox.store.sqlite import SqliteStore


def placeholder(box: Box) -> str:
    return "?" if box.store.dialect == "sqlite" else "%s"


def sql(box: Box, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement in its own transaction on a fresh connection; return its rows."""
    statement = statement.replace("?", placeholder(box))
    if isinstance(box.store, SqliteStore):
        conn = box.store.connect()
        try:
            cursor = conn.execute(statement, params)
            rows = cursor.fetchall() if cursor.description else []
            return [tuple(r) for r in rows]
        finally:
            conn.close()
    assert isinstance(box.store, PostgresStore)
    with box.store.connect(autocommit=True) as pg:
        found = pg.execute(statement.encode(), params or None)
        return [tuple(r) for r in found.fetchall()] if found.description else []


def create_effects(box: Box) -> None:
    """A business table: one row per effect a handler had (the thing that must happen once)."""
    sql(box, "CREATE TABLE effects (key TEXT, note TEXT)")


def record_effect(ctx: Any, note: str = "") -> None:
    ph = "?" if ctx.dialect == "sqlite" else "%s"
    ctx.connection.execute(f"INSERT INTO effects (key, note) VALUES ({ph}, {ph})", (ctx.key, note))


def effects(box: Box) -> list[tuple[Any, ...]]:
    return sql(box, "SELECT key, note FROM effects ORDER BY key, note")


def lock_waits(url: str) -> int:
    """How many sessions of the PostgreSQL database at `url` wait for a lock right now: how a
    race test knows the other transaction has reached the row it must wait for."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0
