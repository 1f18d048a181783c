"""The project's Box, built from Django's settings: `from oncebox.contrib.django import box`.

One Box per process, made when first asked for (tasks modules ask while Django starts). Its store
is Django's database for the alias `settings.ONCEBOX['DATABASE']` names, opened on first use
(`deferred.py`); an enqueue inside `transaction.atomic()` joins Django's transaction, and
handlers write through Django's models in the claim's transaction (`claims.py`).
"""

from __future__ import annotations

import threading
from typing import cast

from oncebox.box import Box
from oncebox.contrib.django.claims import DjangoModels
from oncebox.contrib.django.conf import database_url, read_settings
from oncebox.contrib.django.deferred import DeferredStore
from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.metrics import Metrics
from oncebox.store.protocol import Store

_made: Box | None = None
_lock = threading.Lock()


def get_box() -> Box:
    """The project's Box (made once per process; see the module docstring)."""
    global _made  # noqa: PLW0603 (one per process, like Django's own connections)
    with _lock:
        if _made is None:
            _made = _build()
        return _made


def _build() -> Box:
    from django.conf import settings  # noqa: PLC0415 (Django is optional)
    from django.db import connections  # noqa: PLC0415

    if not settings.USE_TZ:
        raise ConfigurationError(
            "oncebox.contrib.django needs USE_TZ = True (Django's default): oncebox's times are "
            "aware, and its consumers read them through Django's connection settings"
        )
    ours = read_settings()
    alias = ours.alias
    engine = str(connections.settings[alias].get("ENGINE", ""))
    dialect = "postgres" if engine.endswith("postgresql") else "sqlite"
    database_url(connections.settings[alias], ours)  # a database oncebox cannot use: say so now
    models = DjangoModels(alias)
    store = DeferredStore(
        lambda: database_url(connections[alias].settings_dict, ours),
        dialect,
        Metrics(),
        models.configure,
    )
    box = Box(store=_as_store(store), secret=ours.secret)
    box.runtime.orm = models

    def ambient() -> object | None:
        connection = connections[alias]
        # inside `atomic` (a view's), or on a lane inside a handler (the claim's transaction)
        return connection if connection.in_atomic_block else None

    box.runtime.ambient_connection = ambient
    if ours.email is not None:
        box.channel("email", ours.email)
    return box


def _as_store(store: DeferredStore) -> Store:
    return cast(Store, store)  # answers every Store attribute by opening the real one
