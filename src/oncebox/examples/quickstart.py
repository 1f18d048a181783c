"""The quick-start demo (`oncebox demo`): one key, many deliveries, one effect.

1. The same job is enqueued twice: the second enqueue writes nothing and says so.
2. A worker runs it: the handler writes its business row in the claim's transaction.
3. A broker redelivers the same message (as standard queues may, after a lost acknowledgement):
   the delivery finds the key claimed and completes as a `duplicate` — no second row.
4. The invariants are checked from the database: one intent and one business row per key.

Exit 0 when they hold, 1 (with the evidence) when they do not.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from oncebox.box import Box
from oncebox.context import JobContext
from oncebox.testing import RedeliveringTransport

DEFAULT_FILE = "oncebox-demo.db"


def _reset(url: str) -> None:
    if url == f"sqlite:///{DEFAULT_FILE}":
        for suffix in ("", "-wal", "-shm", ".clock"):
            Path(DEFAULT_FILE + suffix).unlink(missing_ok=True)


def run_demo(url: str, echo: Callable[[str], None] = print) -> int:
    _reset(url)
    box = Box(url)
    sqlite = box.store.dialect == "sqlite"
    table = "demo_welcome_sent"
    placeholder = "?" if sqlite else "%s"

    @box.task(key="welcome-email/customer-{customer_id}")
    def welcome_email(ctx: JobContext, customer_id: int) -> None:
        ctx.connection.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, customer_id INTEGER)"
        )
        ctx.connection.execute(
            f"INSERT INTO {table} (key, customer_id) VALUES ({placeholder}, {placeholder})",
            (ctx.key, customer_id),
        )

    try:
        echo(f"oncebox demo on {box.where}")
        first = box.enqueue(welcome_email, customer_id=42)
        second = box.enqueue(welcome_email, customer_id=42)
        echo(
            f"1. enqueue customer 42: created={first.created} (job {first.job_id}, key {first.key})"
        )
        echo(
            f"   enqueue it again:    created={second.created} ({second.reason}, job "
            f"{second.job_id} is {second.state}) — nothing written"
        )

        worked = box.work(until_idle=True).consumed
        echo(f"2. worker: {worked.completed} completed, {worked.duplicates} duplicate(s)")

        broker = RedeliveringTransport(copies=2)
        broker.publish("welcome_email", customer_id=42)
        consumer = box.consumer(transport=broker)
        try:
            redelivered = consumer.run_once()
        finally:
            consumer.session.close()
        echo(
            f"3. the broker delivers the same message {redelivered.leased} times: "
            f"{redelivered.completed} completed, {redelivered.duplicates} duplicate(s) absorbed"
        )

        rows = _business_rows(box, table, sqlite)
        intents = box.store.intent_count()
        echo(f"4. business rows for the key: {rows}; intents: {intents}")
        if rows == 1 and intents == 1 and redelivered.completed == 0:
            echo("invariants hold: one intent and one effect per key, however often delivered")
            return 0
        echo(
            f"INVARIANT VIOLATED: expected 1 row, 1 intent and 0 new completions; got {rows} "
            f"row(s), {intents} intent(s), {redelivered.completed} completion(s)"
        )
        return 1
    finally:
        box.close()


def _business_rows(box: Box, table: str, sqlite: bool) -> int:
    if sqlite:
        path = getattr(box.store, "path")  # noqa: B009 (SqliteStore only)
        with sqlite3.connect(path) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    import psycopg  # noqa: PLC0415 (the driver of the database the demo runs on)

    with psycopg.connect(getattr(box.store, "conninfo")) as conn:  # noqa: B009
        row = conn.execute(f"SELECT count(*) FROM {table}".encode()).fetchone()
        return int(row[0]) if row else 0
