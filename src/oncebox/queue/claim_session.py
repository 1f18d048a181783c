"""`ctx.session`: a SQLAlchemy Session on the claim's own connection, for handlers whose
business writes go through their ORM.

Why: a handler that opens a Session of its own writes outside the claim's transaction, and
"all or nothing" silently breaks — the intent commits while the ORM's rows do not, or the other
way round. This Session's connection is the handler's guarded connection (`store/guard.py`), so
its rows land in the handler's savepoint inside the claim's transaction: they commit with the
claim, the outbox rows and the job's completion, and a handler that raises undoes only its own.

How: one Engine per box (configured once, `box.use_sqlalchemy(**session_options)`) with no pool
of its own; its "connections" are the guarded connection of the handler running on this thread.
The Session joins a transaction it does not own, so the ORM cannot end it: `commit`, `rollback`
and `close` of the Session, of its Connection or of the driver connection under it are refused as
the raw ones are. SQLAlchemy's own housekeeping rollbacks (after it first inspects the server,
when oncebox releases the Connection) are let through as no-ops, and only then. Pending ORM
changes are flushed when the handler returns — a flush that fails (a constraint, say) fails the
job like any handler error — and discarded when it raises.

SQLAlchemy is an optional dependency (`oncebox[sqlalchemy]`), imported when configured.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.extras import needs
from oncebox.store.guard import refusal
from oncebox.store.protocol import HandlerConnection

_DRIVER_URLS = {"postgres": "postgresql+psycopg://", "sqlite": "sqlite://"}
_OURS = frozenset({"bind", "binds", "join_transaction_mode"})
NOT_CONFIGURED = (
    "ctx.session needs the ORM configured once, before the worker starts: box.use_sqlalchemy() "
    "(with any Session options), and the oncebox[sqlalchemy] extra installed"
)


class ClaimDriverConnection:
    """What SQLAlchemy sees as the driver connection: the handler's guarded connection, whose
    commit, rollback and close are refused unless oncebox itself is tidying up."""

    def __init__(self, guarded: HandlerConnection) -> None:
        self._guarded = guarded
        self.housekeeping = True  # while SQLAlchemy inspects the server on first connect

    def commit(self) -> None:
        raise refusal("commit")

    def rollback(self) -> None:
        if not self.housekeeping:
            raise refusal("roll back")

    def close(self) -> None:
        if not self.housekeeping:
            raise refusal("close")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._guarded, name)


class ClaimSessions:
    """The Engine and Session options of one box; `open(guarded)` gives a handler its Session."""

    def __init__(self, dialect: str, options: Mapping[str, Any]) -> None:
        with needs("sqlalchemy", "box.use_sqlalchemy()"):
            import sqlalchemy as sa  # noqa: PLC0415 (optional)
            from sqlalchemy.pool import NullPool  # noqa: PLC0415 (optional)
        clash = _OURS & set(options)
        if clash:
            raise ConfigurationError(
                f"use_sqlalchemy: {', '.join(sorted(clash))} is oncebox's to set (the session "
                "is bound to the claim's connection)"
            )
        self.options = dict(options)
        self.session_class = _claim_session_class()
        self._current = threading.local()
        # no native hstore: registering it asks psycopg for the driver's own connection, which
        # a handler never gets (the guard stands in for it)
        dialect_options = {"use_native_hstore": False} if dialect == "postgres" else {}
        self.engine = sa.create_engine(
            _DRIVER_URLS[dialect],
            creator=self._driver_connection,
            poolclass=NullPool,
            pool_reset_on_return=None,
            **dialect_options,
        )

    def _driver_connection(self) -> ClaimDriverConnection:
        connection: ClaimDriverConnection | None = getattr(self._current, "connection", None)
        if connection is None:
            raise ConfigurationError("ctx.session is for a handler, while it runs")
        return connection

    def open(self, guarded: HandlerConnection) -> HandlerSession:
        return HandlerSession(self, guarded)


class HandlerSession:
    """One handler's Session, made on first use of `ctx.session`."""

    def __init__(self, sessions: ClaimSessions, guarded: HandlerConnection) -> None:
        self._sessions = sessions
        self._guarded = guarded
        self._driver: ClaimDriverConnection | None = None
        self._connection: Any = None
        self.session: Any = None

    def get(self) -> Any:
        if self.session is None:
            sessions = self._sessions
            self._driver = ClaimDriverConnection(self._guarded)
            sessions._current.connection = self._driver
            try:
                self._connection = sessions.engine.connect()
                self._connection.begin()  # SQLAlchemy's record of the claim's transaction
            finally:
                sessions._current.connection = None
            self._driver.housekeeping = False
            self.session = sessions.session_class(
                bind=self._connection, join_transaction_mode="rollback_only", **sessions.options
            )
        return self.session

    def flush(self) -> None:
        """The handler returned: its pending ORM changes join the claim's transaction."""
        if self.session is not None:
            self.session.flush()

    def close(self) -> None:
        """Forget the Session and release the Connection, touching nothing in the database."""
        if self.session is None:
            return
        assert self._driver is not None
        self._driver.housekeeping = True
        try:
            self.session.discard()
            self._connection.close()
        finally:
            self.session = None


def _claim_session_class() -> type[Any]:
    from sqlalchemy.orm import Session  # noqa: PLC0415 (optional)

    class ClaimSession(Session):
        """A Session in the claim's transaction: it may flush, never end that transaction."""

        def commit(self) -> None:
            raise refusal("commit")

        def rollback(self) -> None:
            raise refusal("roll back")

        def close(self) -> None:
            raise refusal("close")

        def discard(self) -> None:
            """oncebox's own close when the handler is over (the transaction is not touched)."""
            Session.close(self)

    return ClaimSession
