"""What the consumer asks of an ORM that handlers write through (`ctx.session` for SQLAlchemy,
Django's models for `oncebox.contrib.django`): open it on the handler's guarded connection before
the handler runs, flush it when the handler returns — a failing flush fails the job — and close
it either way. Whatever the ORM writes then lands in the handler's savepoint, inside the claim's
transaction."""

from __future__ import annotations

from typing import Any, Protocol

from oncebox.store.protocol import HandlerConnection


class HandlerOrm(Protocol):
    """The ORM for one handler run."""

    def get(self) -> Any:
        """`ctx.session`: what a handler asks for by name, or a ConfigurationError saying what
        to use instead."""
        ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Orm(Protocol):
    """Configured once per box; opened once per handler run."""

    def open(self, guarded: HandlerConnection) -> HandlerOrm: ...
