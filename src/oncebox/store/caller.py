"""The caller's connection: what `connection=` accepts, unwrapped to the driver's own.

A job enqueued on the caller's connection commits or rolls back with the caller's work, so the
store must write through the very connection — and transaction — the caller's work is on. The
stores drive psycopg 3 and sqlite3; a SQLAlchemy `Session` or `Connection` on those drivers is
unwrapped here to the driver connection of its transaction. SQLAlchemy's transaction is begun
first when it has not begun: a statement sent on the driver connection alone would open a
transaction SQLAlchemy does not know about, its `commit()` would then do nothing, and the job
would vanish when the connection went back to the pool.

SQLAlchemy is imported only when the caller hands over one of its objects: it is an optional
dependency (`oncebox[sqlalchemy]`).
"""

from __future__ import annotations

from typing import Any

from oncebox.errors import ConfigurationError

#: Drivers whose connections look usable but are not the ones the stores drive.
_OTHER_DRIVERS = {
    "psycopg2": "a psycopg2 connection, which oncebox does not drive: use psycopg 3 "
    "(psycopg.connect, or postgresql+psycopg:// in SQLAlchemy)",
    "asyncpg": "an asyncpg connection, which oncebox does not drive: use psycopg 3 "
    "(postgresql+psycopg:// in SQLAlchemy, sync or async)",
    "aiosqlite": "an aiosqlite connection: on SQLite, enqueue in the caller's transaction with "
    "a sqlite3 connection (sqlite:// in SQLAlchemy)",
}


def driver_connection(connection: object) -> object:
    """The driver connection (psycopg 3 or sqlite3) to write on for `connection=`; a SQLAlchemy
    Session or Connection is unwrapped, its transaction begun; anything else is returned as it
    is, for the store to check."""
    module = type(connection).__module__
    root = module.partition(".")[0]
    if root in _OTHER_DRIVERS:
        raise ConfigurationError(f"connection= is {_OTHER_DRIVERS[root]}")
    if root == "sqlalchemy":
        return _from_sqlalchemy(connection)
    return connection


def _from_sqlalchemy(connection: Any) -> object:
    from sqlalchemy.engine import Connection, Engine  # noqa: PLC0415 (optional)
    from sqlalchemy.orm import Session  # noqa: PLC0415 (optional)

    kind = type(connection).__name__
    if type(connection).__module__.startswith("sqlalchemy.ext.asyncio"):
        # (by module: importing SQLAlchemy's asyncio support needs greenlet, which a sync
        # application need not have)
        if kind == "AsyncEngine":
            connection = None  # refused below, as an Engine
        else:
            raise ConfigurationError(
                f"connection= is a SQLAlchemy {kind}: enqueue on it with the awaitable surface "
                "(await box.aio.enqueue(..., connection=...))"
            )
    if connection is None or isinstance(connection, Engine):
        raise ConfigurationError(
            f"connection= is a SQLAlchemy {kind}, which has no transaction to join: pass a "
            "Connection (engine.begin()) or a Session"
        )
    if isinstance(connection, Session):
        connection = connection.connection()  # begins the session's transaction if need be
    if not isinstance(connection, Connection):
        raise ConfigurationError(
            f"connection= is a SQLAlchemy {kind}: pass a Session or a Connection"
        )
    if not connection.in_transaction():
        connection.begin()  # SQLAlchemy's commit is then the one that commits the job
    return connection.connection.driver_connection
