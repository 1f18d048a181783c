"""A dock-slot holds table and the hold-expiry sweeper over it, in either dialect."""

from __future__ import annotations

from datetime import datetime

from oncebox import Box, SweepContext
from oncebox.kernel.clock import to_micros
from support.db import sql

SECRET = "holds-test-secret-0123456789"


def holds_box(url: str, batch_size: int = 100) -> Box:
    box = Box(url, secret=SECRET)
    box.channel("email", provider="null:")
    postgres = box.store.dialect == "postgres"
    expires_type = "timestamptz" if postgres else "INTEGER"
    sql(
        box,
        f"CREATE TABLE IF NOT EXISTS holds (id INTEGER PRIMARY KEY, state TEXT NOT NULL, "
        f"expires_at {expires_type} NOT NULL, email TEXT NOT NULL)",
    )

    @box.sweeper("hold-expiry", batch_size=batch_size)
    def expire_holds(ctx: SweepContext) -> int:
        now = ctx.now if postgres else to_micros(ctx.now)
        if postgres:
            statement = (
                "UPDATE holds SET state = 'expired' WHERE id IN (SELECT id FROM holds "
                "WHERE state = 'held' AND expires_at <= %s ORDER BY expires_at LIMIT %s "
                "FOR UPDATE SKIP LOCKED) RETURNING id, email"
            )
        else:
            statement = (
                "UPDATE holds SET state = 'expired' WHERE id IN (SELECT id FROM holds "
                "WHERE state = 'held' AND expires_at <= ? ORDER BY expires_at LIMIT ?) "
                "RETURNING id, email"
            )
        rows = ctx.connection.execute(statement, (now, ctx.limit)).fetchall()
        for hold_id, email in rows:
            ctx.notice(f"hold-expired/hold-{hold_id}").email(
                to=email, subject=f"Your dock slot hold {hold_id} has expired", text="…"
            )
        return len(rows)

    return box


def add_hold(box: Box, hold_id: int, expires_at: datetime, state: str = "held") -> None:
    value = expires_at if box.store.dialect == "postgres" else to_micros(expires_at)
    sql(
        box,
        "INSERT INTO holds (id, state, expires_at, email) VALUES (?, ?, ?, ?)",
        (hold_id, state, value, f"hold-{hold_id}@freight.example"),
    )


def hold_states(box: Box) -> dict[int, str]:
    return {row[0]: row[1] for row in sql(box, "SELECT id, state FROM holds ORDER BY id")}
