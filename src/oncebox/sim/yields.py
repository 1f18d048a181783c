"""The store as the actors see it: every operation a yield point.

`YieldingStore` wraps the real store (SQLite or PostgreSQL, unchanged) and parks the calling actor
before each operation, so the scheduler decides which actor's statement runs next. The consumer's
dedicated session and its transaction are wrapped the same way, with three more points: before
`BEGIN`, before `COMMIT` (a crash there rolls the transaction back) and after it (a crash there
comes after the commit). A call that blocked in the database parks again when it returns
(`Scheduler.after`), before any more of its actor's code runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from oncebox.sim.scheduler import Scheduler

# Operations that touch nothing another actor can see: no point before them (the store's clock
# is moved by the scheduler only, between steps).
QUIET = frozenset({"clock_now", "close", "check_identity", "due_seen", "supports_notifications"})


def _yielding(scheduler: Scheduler, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def at_point(*args: Any, **kwargs: Any) -> Any:
        scheduler.point(name)
        try:
            return call(*args, **kwargs)
        finally:  # a call that blocked parks when it ends, however it ends (a deadlock's victim)
            scheduler.after(name)

    return at_point


class YieldingStore:
    """See the module docstring. Attributes that are not operations pass through."""

    def __init__(self, store: Any, scheduler: Scheduler) -> None:
        self._store = store
        self._scheduler = scheduler
        self.sessions: dict[str, list[Any]] = {}  # each actor's dedicated sessions

    def drop_sessions(self, actor: str) -> None:
        """Close an actor's dedicated sessions as its process's death would: an open
        transaction rolled back, the connection gone."""
        for session in self.sessions.pop(actor, []):
            with contextlib.suppress(Exception):  # a dead process's connection: nothing to save
                session.close()

    def keep_for_crash(self, connection: Any) -> None:
        """A connection the running actor opened itself, as an application does: closed with
        its sessions when it crashes."""
        self.sessions.setdefault(self._scheduler.current() or "", []).append(connection)

    def _session(self, *args: Any, **kwargs: Any) -> YieldingSession:
        session = self._store.consumer_session(*args, **kwargs)
        self.sessions.setdefault(self._scheduler.current() or "", []).append(session)
        return YieldingSession(session, self._scheduler)

    @property
    def real(self) -> Any:
        """The store itself, for the checker (which reads between steps, at no point)."""
        return self._store

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if name.startswith("_") or not callable(value) or name in QUIET:
            return value
        if name == "consumer_session":
            return self._session
        return _yielding(self._scheduler, f"store.{name}", value)


class YieldingSession:
    """A consumer's dedicated session: its lease, release and transaction are yield points."""

    def __init__(self, session: Any, scheduler: Scheduler) -> None:
        self._session = session
        self._scheduler = scheduler

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._session, name)
        if name.startswith("_") or not callable(value) or name in QUIET:
            return value
        return _yielding(self._scheduler, f"session.{name}", value)

    @contextmanager
    def transaction(self) -> Iterator[YieldingTx]:
        scheduler = self._scheduler
        scheduler.point("tx.begin")
        with self._session.transaction() as tx:
            scheduler.after("tx.begin")
            yield YieldingTx(tx, scheduler)
            scheduler.point("tx.commit")
        scheduler.after("tx.commit")
        scheduler.point("tx.committed")


class YieldingTx:
    """The consumer transaction: each claim, insert and settlement a yield point."""

    def __init__(self, tx: Any, scheduler: Scheduler) -> None:
        self._tx = tx
        self._scheduler = scheduler

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._tx, name)
        if name.startswith("_") or not callable(value):
            return value
        if name == "handler_scope":
            return self._handler_scope
        return _yielding(self._scheduler, f"tx.{name}", value)

    @contextmanager
    def _handler_scope(self) -> Iterator[Any]:
        self._scheduler.point("tx.handler")
        with self._tx.handler_scope() as connection:
            yield connection
