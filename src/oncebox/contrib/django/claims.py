"""Handlers on Django's ORM: in a worker, Django's connection *is* the claim's transaction.

While a handler runs on a consumer lane, that lane thread's Django connection for oncebox's
alias is a DatabaseWrapper whose database connection is the handler's guarded connection
(`store/guard.py`), marked as inside an atomic block that Django did not open. So:

- model writes go to the handler's savepoint inside the claim's transaction: they commit with the
  intent, the outbox rows and the job's completion, or not at all; a handler that raises undoes
  only its own (its savepoint), in a batch too;
- `transaction.atomic()` in a handler nests as savepoints;
- `transaction.commit()`, `rollback()` and `set_autocommit()` are refused by Django itself (an
  atomic block is active), and the guard refuses whatever reaches the driver (`close()`, SQL
  `COMMIT`);
- `transaction.on_commit()` is refused: Django would never run it (it never commits this
  transaction), and a side effect after the claim is what the outbox is for.

The consumer's own connections are opened with Django's connection parameters
(`consumer_connect_params` / `consumer_connect`), so the ORM finds its adapters, cursors and SQL
functions on them. Between handlers the wrapper holds no connection: nothing of Django's runs on
a lane thread outside a handler, so `close_old_connections` and `CONN_MAX_AGE` do not apply
there (the consumer reconnects a lost connection itself).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from oncebox.kernel.errors import ConfigurationError, TransactionControlRefused
from oncebox.store.protocol import HandlerConnection, Store

ON_COMMIT = (
    "transaction.on_commit() in a handler: the claim's transaction commits after the handler, "
    "under oncebox's control, and Django would never call it; write the side effect to the "
    "outbox (ctx.outbox), which sends it once after the commit"
)
NO_SESSION = (
    "ctx.session is a SQLAlchemy Session; with oncebox.contrib.django, use your models: they "
    "write in the claim's transaction"
)


def _wrapper_class(base: type) -> type:
    def on_commit(self: Any, func: Any, robust: bool = False) -> None:
        raise TransactionControlRefused(ON_COMMIT)

    # Django's module, as the wrapper it stands for: `connection=` recognises Django's objects so
    namespace = {"on_commit": on_commit, "__module__": base.__module__}
    return type(f"Claim{base.__name__}", (base,), namespace)


class DjangoModels:
    """The box's `Orm` under Django: one claim wrapper per lane thread, opened per handler."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._threads = threading.local()

    def configure(self, store: Store) -> None:
        """Open the consumers' connections the way Django opens the alias's."""
        from django.db import connections  # noqa: PLC0415 (Django is optional)

        def params() -> dict[str, Any]:
            return dict(connections.create_connection(self.alias).get_connection_params())

        if store.dialect == "postgres":
            store.consumer_connect_params = params  # type: ignore[attr-defined]
        else:

            def connect() -> Any:
                wrapper = connections.create_connection(self.alias)
                return wrapper.get_new_connection(wrapper.get_connection_params())

            store.consumer_connect = connect  # type: ignore[attr-defined]

    def open(self, guarded: HandlerConnection) -> HandlerModels:
        from django.db import connections  # noqa: PLC0415

        wrapper = getattr(self._threads, "wrapper", None)
        if wrapper is None:
            made = connections.create_connection(self.alias)
            # a server-side cursor (QuerySet.iterator()) needs the driver connection itself,
            # which the guard keeps from handlers: chunked reads on the claim's cursor instead
            settings = {**made.settings_dict, "DISABLE_SERVER_SIDE_CURSORS": True}
            wrapper = _wrapper_class(type(made))(settings, self.alias)
            self._threads.wrapper = wrapper
        # the thread's own connection comes back when the handler ends (a test that drains
        # jobs in its own thread goes on with its own)
        previous = connections[self.alias]
        connections[self.alias] = wrapper
        return HandlerModels(
            wrapper, guarded, lambda: connections.__setitem__(self.alias, previous)
        )


class HandlerModels:
    """Django's connection state for one handler run: inside a transaction it did not begin."""

    def __init__(
        self, wrapper: Any, guarded: HandlerConnection, restore: Callable[[], None]
    ) -> None:
        self._wrapper = wrapper
        self._restore = restore
        from django.db.transaction import Atomic  # noqa: PLC0415 (Django is optional)

        wrapper.connection = guarded
        wrapper.autocommit = False
        wrapper.in_atomic_block = True
        # True, though nothing here commits: Django ends "the outermost block" — and with it
        # in_atomic_block — when the last nested block exits and this is False
        wrapper.commit_on_exit = True
        wrapper.needs_rollback = False
        wrapper.closed_in_transaction = False
        wrapper.savepoint_ids = []
        # the block the claim stands for: `atomic(durable=True)` in a handler is refused
        wrapper.atomic_blocks = [Atomic(wrapper.alias, savepoint=False, durable=False)]
        wrapper.run_on_commit = []

    def get(self) -> Any:
        raise ConfigurationError(NO_SESSION)

    def flush(self) -> None:
        """Django writes as it goes: nothing is pending when the handler returns — unless Django
        marked the transaction for rollback (a database error the handler caught and carried on
        from): then the job fails, and its savepoint undoes what it wrote, on both stores
        (PostgreSQL would refuse the commit anyway; SQLite would keep the half-done writes)."""
        if self._wrapper.needs_rollback:
            raise ConfigurationError(
                "the handler carried on after a database error inside the claim's transaction; "
                "Django marked it for rollback, so this attempt fails: let the error propagate, "
                "or catch it around a transaction.atomic() block of its own"
            )

    def close(self) -> None:
        wrapper = self._wrapper
        wrapper.in_atomic_block = False
        wrapper.needs_rollback = False
        wrapper.savepoint_ids = []
        wrapper.atomic_blocks = []
        wrapper.connection = None
        wrapper.autocommit = True
        self._restore()
