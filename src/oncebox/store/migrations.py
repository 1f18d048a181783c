"""What the two stores share about migrations: checksums, the status, splitting scripts.

Migrations are numbered, additive, plain SQL per dialect (`store/sql/<dialect>/migrations/`).
A worker refuses a database that lacks a migration it knows ("run `oncebox migrate`") and runs,
with a warning, on one that has migrations it does not know (a newer release applied additive
changes) — so rolling deploys and rollbacks both work.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable

from oncebox.kernel.errors import SchemaError
from oncebox.store.records import SchemaStatus

log = logging.getLogger("oncebox.schema")


def check_runnable(status: SchemaStatus, where: str) -> None:
    """Raise if this code cannot run on the schema; warn if the schema is newer."""
    if status.missing:
        raise SchemaError(
            f"the database at {where} is at schema version {status.current}; this oncebox needs "
            f"version {status.required} (missing {', '.join(map(str, status.missing))}): "
            "run `oncebox migrate`"
        )
    if status.unknown:
        log.warning(
            "the database at %s has schema migrations this oncebox does not know (%s); "
            "running anyway, as migrations are additive",
            where,
            ", ".join(map(str, status.unknown)),
        )


def split_sqlite_script(script: str) -> Iterable[str]:
    """Split a SQLite script into complete statements (trigger bodies stay whole)."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statement = pending.strip()
            pending = ""
            if statement and not all(
                part.strip().startswith("--") or not part.strip() for part in statement.splitlines()
            ):
                yield statement
    if pending.strip() and not all(
        part.strip().startswith("--") or not part.strip() for part in pending.splitlines()
    ):
        raise SchemaError(f"incomplete SQL statement at the end of a migration: {pending[:80]!r}")
