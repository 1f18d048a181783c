"""Failure injection around real parts: a store whose named operations fail for a while."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from oncebox.kernel.errors import StoreUnavailable
from oncebox.store.params import ConsumerSettings
from oncebox.store.protocol import Store


class Outage:
    """Wraps a real store; while an outage is on, its named operations raise `StoreUnavailable`
    (after letting `after` calls through), as they would while the database restarts. Every
    other call, and every call once `restore()`d, goes to the real store. A consumer session it
    opens is wrapped the same way, and so are that session's transactions: an operation failing
    inside one leaves it to the real session, which rolls it back, as a lost connection would."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._failing: set[str] = set()
        self._let_through = 0
        self.refused: list[str] = []

    def fail(self, *operations: str, after: int = 0) -> None:
        self._failing, self._let_through = set(operations), after

    def restore(self) -> None:
        self._failing = set()

    def consumer_session(self, settings: ConsumerSettings) -> Any:
        return _Within(self._store.consumer_session(settings), self)

    def _guarded(self, name: str, real: Any) -> Any:
        if name not in self._failing or not callable(real):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            if name in self._failing and self._let_through <= 0:
                self.refused.append(name)
                raise StoreUnavailable(f"injected outage: {name}")
            self._let_through -= 1
            return real(*args, **kwargs)

        return call

    def __getattr__(self, name: str) -> Any:
        return self._guarded(name, getattr(self._store, name))


class _Within:
    """A consumer session, or one of its transactions, under an `Outage`."""

    def __init__(self, real: Any, outage: Outage) -> None:
        self._real = real
        self._outage = outage

    @contextmanager
    def _transaction(self) -> Iterator[_Within]:
        with self._real.transaction() as tx:
            yield _Within(tx, self._outage)

    def __getattr__(self, name: str) -> Any:
        real = self._transaction if name == "transaction" else getattr(self._real, name)
        return self._outage._guarded(name, real)
