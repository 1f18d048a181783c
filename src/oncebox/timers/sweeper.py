"""Sweepers: durable deadlines kept as rows — the reservation-hold pattern.

A hold (a dock slot reserved until 14:00) is a row with a deadline, not an in-memory timer. The
sweeper lane scans rows whose deadline has passed, a batch at a time, and for each applies the
transition (`held → expired`) **and** writes the notice's outbox row in the same transaction; the
email lane delivers it later, under its own rate limit. A crash leaves both or neither.

    @box.sweeper("hold-expiry", every=timedelta(seconds=30), batch_size=200)
    def expire_holds(ctx: SweepContext) -> int:
        rows = ctx.connection.execute(
            "UPDATE holds SET state = 'expired' WHERE id IN (SELECT id FROM holds "
            "WHERE state = 'held' AND expires_at <= %s ORDER BY expires_at LIMIT %s "
            "FOR UPDATE SKIP LOCKED) RETURNING id, email",            # PostgreSQL
            (ctx.now, ctx.limit)).fetchall()
        for hold_id, email in rows:
            ctx.notice(f"hold-expired/hold-{hold_id}").email(to=email, subject="…", text="…")
        return len(rows)

The transition is the user's SQL (their table); its `WHERE state = 'held'` and the row lock are
what make "a hold confirmed at the moment it expires ends in exactly one state" hold. Each notice
is keyed and claimed like any operation — an intent per key — so even a transition that somehow
ran twice would write its notice once. The handler returns how many rows it handled; a full batch
(`== ctx.limit`) makes the lane run again at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from oncebox.jobs.tasks import check_name
from oncebox.kernel.errors import ConfigurationError
from oncebox.outbox.writer import OutboxWriter

if TYPE_CHECKING:
    pass


@dataclass
class SweepContext:
    """What a sweeper handler receives: the sweep's transaction, the database time to compare
    deadlines with, the batch limit, and `notice(key)` for the outbox."""

    connection: Any
    now: datetime
    limit: int
    dialect: str
    _notice: Callable[[str], OutboxWriter]

    def notice(self, key: str) -> OutboxWriter:
        """The outbox for the operation `key` (e.g. `hold-expired/hold-7`), claimed in this
        transaction."""
        return self._notice(key)


@dataclass(frozen=True)
class Sweeper:
    name: str
    handler: Callable[[SweepContext], int]
    every: timedelta = timedelta(seconds=30)
    batch_size: int = 100
    timeout: timedelta = timedelta(seconds=60)


def make_sweeper(
    name: str,
    handler: Callable[[SweepContext], int],
    *,
    every: timedelta = timedelta(seconds=30),
    batch_size: int = 100,
    timeout: timedelta = timedelta(seconds=60),
) -> Sweeper:
    check_name("sweeper", name)
    if every <= timedelta(0) or timeout <= timedelta(0):
        raise ConfigurationError(f"sweeper {name!r}: every and timeout must be positive")
    if not 1 <= batch_size <= 10_000:
        raise ConfigurationError(f"sweeper {name!r}: batch_size must be within 1..10000")
    return Sweeper(name, handler, every, batch_size, timeout)
