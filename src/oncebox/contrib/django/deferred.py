"""A store opened on first use: Django's database settings are final only then.

A Django project imports its tasks while Django starts (`AppConfig.ready`), before the test
runner has created and renamed the test database, and before `manage.py migrate` has run: a
store opened at import would write to the wrong database, or create a SQLite file that the test
runner then deletes under it. This one reads the URL, opens the store and configures it (the
consumer connections Django's ORM needs) the first time anything asks it for anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from oncebox.kernel.inert import redact
from oncebox.kernel.metrics import Metrics
from oncebox.store import open_store
from oncebox.store.protocol import Store


class DeferredStore:
    """Stands for the store a URL names, opened on first use; see the module docstring."""

    def __init__(
        self,
        url: Callable[[], str],
        dialect: str,
        metrics: Metrics,
        on_open: Callable[[Store], None],
    ) -> None:
        self._url = url
        self._on_open = on_open
        self._store: Store | None = None
        self._lock = threading.Lock()
        self.dialect = dialect
        self.metrics = metrics

    @property
    def where(self) -> str:
        return redact(self._url())

    @property
    def url(self) -> str:
        return self._url()

    def opened(self) -> Store:
        with self._lock:
            if self._store is None:
                store = open_store(self._url(), metrics=self.metrics)
                self._on_open(store)
                self._store = store
            return self._store

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.opened(), name)
