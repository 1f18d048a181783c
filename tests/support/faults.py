"""Failure injection around real parts: a store whose named operations fail for a while."""

from __future__ import annotations

from typing import Any

from oncebox.errors import StoreUnavailable
from oncebox.store.base import Store


class Outage:
    """Wraps a real store; while an outage is on, its named operations raise `StoreUnavailable`
    (after letting `after` calls through), as they would while the database restarts. Every
    other call, and every call once `restore()`d, goes to the real store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._failing: set[str] = set()
        self._let_through = 0
        self.refused: list[str] = []

    def fail(self, *operations: str, after: int = 0) -> None:
        self._failing, self._let_through = set(operations), after

    def restore(self) -> None:
        self._failing = set()

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._store, name)
        if name not in self._failing or not callable(real):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            if name in self._failing and self._let_through <= 0:
                self.refused.append(name)
                raise StoreUnavailable(f"injected outage: {name}")
            self._let_through -= 1
            return real(*args, **kwargs)

        return call
