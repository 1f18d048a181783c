"""What a handler receives as its first argument."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from oncebox.kernel.errors import ConfigurationError
from oncebox.outbox.writer import OutboxWriter
from oncebox.queue.claim_session import NOT_CONFIGURED
from oncebox.queue.handler_orm import HandlerOrm
from oncebox.store.protocol import HandlerConnection


@dataclass(frozen=True, slots=True)
class JobContext:
    """The job being run, the claim's transaction, and its outbox.

    - `connection`: the claim's own connection (sqlite3 or psycopg API), inside the transaction
      that inserted this job's intent and will mark it done — rows written with it commit with
      the claim, or not at all. It refuses commit and rollback.
    - `outbox`: messages for the dispatcher (`ctx.outbox.email(...)`); they commit with the claim
      too, and are sent later, exactly as written.
    - `key`: the business key (None for a task without a key template).
    - `attempt`: counts from 1 and keeps counting across replays.
    - `dialect`: "sqlite" or "postgres", for handlers that must speak both.
    - `job_id`: None for deliveries from a broker transport.
    """

    task: str
    dialect: str
    key: str | None
    job_id: int | None
    attempt: int
    connection: HandlerConnection
    outbox: OutboxWriter
    _now: Callable[[], datetime]
    _orm: HandlerOrm | None = None

    @property
    def session(self) -> Any:
        """A SQLAlchemy Session on `connection`, in the claim's transaction (configure once
        with `box.use_sqlalchemy()`): its rows commit with the claim or not at all; pending
        changes are flushed when the handler returns; commit, rollback and close are refused."""
        if self._orm is None:
            raise ConfigurationError(NOT_CONFIGURED)
        return self._orm.get()

    def now(self) -> datetime:
        """Business time: the database's clock (frozen or offset in tests), aware UTC."""
        return self._now()


_new, _set = object.__new__, object.__setattr__


def job_context(  # noqa: PLR0917 (positional on purpose: one call per job)
    task: str,
    dialect: str,
    key: str | None,
    job_id: int | None,
    attempt: int,
    connection: HandlerConnection,
    outbox: OutboxWriter,
    now: Callable[[], datetime],
    orm: HandlerOrm | None,
) -> JobContext:
    """`JobContext(...)` with every field given, for the consumer (one per job): the frozen
    dataclass's `__init__` looks `object.__setattr__` up anew for each field; this sets them
    through the same call, looked up once — about half the time. A test pins it to the
    constructor, field by field."""
    ctx = _new(JobContext)
    _set(ctx, "task", task)
    _set(ctx, "dialect", dialect)
    _set(ctx, "key", key)
    _set(ctx, "job_id", job_id)
    _set(ctx, "attempt", attempt)
    _set(ctx, "connection", connection)
    _set(ctx, "outbox", outbox)
    _set(ctx, "_now", now)
    _set(ctx, "_orm", orm)
    return ctx
