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

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg.pq import ExecStatus

from oncebox.kernel.errors import ConfigurationError

T = TypeVar("T")
TUPLES_OK = ExecStatus.TUPLES_OK

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
    if root == "django":
        return _from_django(connection)
    return connection


def _from_django(connection: Any) -> object:
    """Django's connection (`django.db.connection`, `connections[alias]`): the driver connection
    under it, opened if need be. Inside `transaction.atomic()` the job then commits or rolls back
    with the block; outside, Django's connection is in autocommit and the job commits at once."""
    if not callable(getattr(connection, "ensure_connection", None)):
        raise ConfigurationError(
            f"connection= is a Django {type(connection).__name__}: pass Django's connection "
            "(django.db.connection or connections[alias])"
        )
    connection.ensure_connection()
    return connection.connection


def _from_sqlalchemy(connection: Any) -> object:
    from sqlalchemy.engine import Connection, Engine  # noqa: PLC0415 (optional)
    from sqlalchemy.orm import Session  # noqa: PLC0415 (optional)

    kind = type(connection).__name__
    # SQLAlchemy's asyncio objects are told apart by name: importing that module needs
    # greenlet, which a sync application need not have
    is_async = type(connection).__module__.startswith("sqlalchemy.ext.asyncio")
    if isinstance(connection, Engine) or (is_async and kind == "AsyncEngine"):
        raise ConfigurationError(
            f"connection= is a SQLAlchemy {kind}, which has no transaction to join: pass a "
            "Connection (engine.begin()) or a Session"
        )
    if is_async:
        raise ConfigurationError(
            f"connection= is a SQLAlchemy {kind}: enqueue on it with the awaitable surface "
            "(await box.aio.enqueue(..., connection=...))"
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


class LoopConnection:
    """A psycopg `AsyncConnection`, driven from a worker thread.

    The awaitable surface (`oncebox/aio.py`) runs the sync core — its statements, their
    parameters, its reading of results — in a worker thread, so the event loop never waits on
    the database. When the caller hands over an async connection, each statement is sent on it by
    the loop that owns it, and the worker thread waits for the answer: the job is written in the
    caller's async transaction by the very code a sync enqueue runs. It answers what the
    PostgreSQL store asks of a connection (`execute`, `autocommit`, `transaction`, `pipeline`),
    nothing more.

    A call whose awaiting task is cancelled stops where it is (`cancel`): the statement in flight
    is cancelled on the server and no other is sent — the caller, whose transaction it is, rolls
    back what was. Whether to send is decided on the loop, where `cancel` runs, so a cancel
    between two statements is never missed."""

    def __init__(self, connection: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = connection
        self._loop = loop
        self._cancelled = False  # these two are read and written on the loop only
        self._in_flight: asyncio.Task[Any] | None = None

    def _run(self, step: Coroutine[Any, Any, T], *, closing: bool = False) -> T:
        return asyncio.run_coroutine_threadsafe(self._send(step, closing), self._loop).result()

    async def _send(self, step: Coroutine[Any, Any, T], closing: bool) -> T:
        if closing:  # the end of this call's own transaction block: never cut short
            return await step
        if self._cancelled:
            step.close()
            raise asyncio.CancelledError  # the caller's task was cancelled: send nothing more
        self._in_flight = asyncio.current_task()
        try:
            return await step
        finally:
            self._in_flight = None

    def cancel(self) -> None:
        """On the loop, when the task awaiting the call is cancelled: no statement is sent after
        this, and the one in flight is cancelled (psycopg cancels it on the server)."""
        self._cancelled = True
        if self._in_flight is not None:
            self._in_flight.cancel()

    def execute(self, sql: Any, params: Any = None) -> Fetched:
        return self._run(self._execute(sql, params))

    async def _execute(self, sql: Any, params: Any) -> Fetched:
        cursor = await self._conn.execute(sql, params)
        found = cursor.pgresult
        rows = await cursor.fetchall() if found is not None and found.status == TUPLES_OK else []
        return Fetched(found, cursor.rowcount, cursor.description, rows)

    @property
    def autocommit(self) -> bool:
        return bool(self._conn.autocommit)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """The call's own block on a connection in autocommit. Its end is sent even after a
        cancel — a rollback then, which leaves the connection as the caller had it."""
        block = self._conn.transaction()
        self._run(block.__aenter__())
        try:
            yield
        except BaseException as error:
            self._run(block.__aexit__(type(error), error, error.__traceback__), closing=True)
            raise
        self._run(self._end(block), closing=True)

    async def _end(self, block: Any) -> None:
        if self._cancelled:
            cancelled = asyncio.CancelledError()
            await block.__aexit__(asyncio.CancelledError, cancelled, None)
            raise cancelled
        await block.__aexit__(None, None, None)

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        yield  # one statement after another: a pipeline is an optimisation, not a meaning


@dataclass(frozen=True, slots=True)
class Fetched:
    """A statement's answer, read on the loop, as the store reads a cursor."""

    pgresult: Any
    rowcount: int
    description: Any
    rows: list[Any]

    def fetchall(self) -> list[Any]:
        return self.rows


async def loop_connection(connection: object, dialect: str) -> LoopConnection | None:
    """What the awaitable surface writes on for `connection=`: None (the box's own pool, from a
    worker thread), or the caller's async PostgreSQL connection — psycopg's `AsyncConnection`, or
    SQLAlchemy's `AsyncSession`/`AsyncConnection` on postgresql+psycopg, whose transaction is
    begun first if it has not begun (as for a sync Session)."""
    if connection is None:
        return None
    kind = type(connection).__name__
    if type(connection).__module__.startswith("sqlalchemy.ext.asyncio"):
        connection = await _from_async_sqlalchemy(connection)
    if dialect != "postgres":
        raise ConfigurationError(
            f"connection= is a {kind}: on SQLite, enqueue in the caller's transaction with the "
            "sync API and a sqlite3 connection (or a sync SQLAlchemy Session)"
        )
    import psycopg  # noqa: PLC0415 (the PostgreSQL store's driver)

    if not isinstance(connection, psycopg.AsyncConnection):
        raise ConfigurationError(
            f"connection= is a {kind}: box.aio takes psycopg's AsyncConnection or SQLAlchemy's "
            "AsyncSession or AsyncConnection (on postgresql+psycopg); for a sync connection use "
            "box.enqueue(...)"
        )
    return LoopConnection(connection, asyncio.get_running_loop())


async def _from_async_sqlalchemy(connection: Any) -> object:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession  # noqa: PLC0415 (optional)

    if isinstance(connection, AsyncSession):
        connection = await connection.connection()  # begins the session's transaction
    if not isinstance(connection, AsyncConnection):
        raise ConfigurationError(
            f"connection= is a SQLAlchemy {type(connection).__name__}, which has no transaction "
            "to join: pass an AsyncConnection (engine.begin()) or an AsyncSession"
        )
    if not connection.in_transaction():
        await connection.begin()  # SQLAlchemy's commit is then the one that commits the job
    raw = await connection.get_raw_connection()
    return raw.driver_connection
