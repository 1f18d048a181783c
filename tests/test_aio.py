"""The awaitable surface (`box.aio`): what a web request does — enqueue, enqueue many, cancel, a
key's receipts — awaited without blocking the event loop, in the caller's async transaction when
it hands one over (psycopg's AsyncConnection, SQLAlchemy's AsyncSession or AsyncConnection)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from oncebox import Box
from oncebox.errors import ConfigurationError
from oncebox.store.postgres import PostgresStore
from support.apps import digest_box

KEY = "weekly-digest/customer-{}/2026-W33"
ARGS: dict[str, Any] = {"customer_id": 1, "period": "2026-W33"}


def _digest_box(url: str) -> Iterator[Box]:
    box = digest_box(url)
    try:
        yield box
    finally:
        box.close()


@pytest.fixture
def box(store_url: str) -> Iterator[Box]:
    yield from _digest_box(store_url)


@pytest.fixture
def pg_box(pg_url: str) -> Iterator[Box]:
    yield from _digest_box(pg_url)


def conninfo(box: Box) -> str:
    assert isinstance(box.store, PostgresStore)
    return box.store.conninfo


def test_enqueue_cancel_and_receipts_are_awaitable(box: Box):
    async def request() -> tuple[bool, int, str]:
        made = await box.aio.enqueue("weekly_digest", **ARGS, delay=None)
        many = await box.aio.enqueue_many(
            "weekly_digest", [{"customer_id": c, "period": "2026-W33"} for c in (1, 2, 3)]
        )
        cancelled = await box.aio.cancel(KEY.format(2), reason="customer left")
        chain = await box.aio.receipts(KEY.format(1))
        return made.created, many.created, f"{cancelled.key} {chain.jobs[0].job.state}"

    assert asyncio.run(request()) == (True, 2, f"{KEY.format(2)} ready")


@pytest.mark.postgres
def test_an_async_connection_commits_and_rolls_back_the_job_with_its_transaction(pg_box: Box):
    async def request() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo(pg_box)) as conn:
            await pg_box.aio.enqueue(
                "weekly_digest", customer_id=1, period="2026-W33", connection=conn
            )
            await conn.rollback()
            await pg_box.aio.enqueue_many(
                "weekly_digest",
                [{"customer_id": c, "period": "2026-W33"} for c in (2, 3)],
                connection=conn,
            )
            await conn.commit()

    asyncio.run(request())
    assert pg_box.store.job_find_by_key(KEY.format(1)) == []
    assert len(pg_box.store.job_find_by_key(KEY.format(3))) == 1


@pytest.mark.postgres
def test_an_async_sqlalchemy_session_commits_the_job_with_its_rows(pg_box: Box):
    url = conninfo(pg_box).replace("postgresql://", "postgresql+psycopg://", 1)

    async def request(fail: bool) -> None:
        engine = create_async_engine(url)
        try:
            async with AsyncSession(engine) as session:
                await pg_box.aio.enqueue(
                    "weekly_digest",
                    customer_id=1 if fail else 2,
                    period="2026-W33",
                    connection=session,
                )
                if fail:
                    await session.rollback()
                else:
                    await session.commit()
        finally:
            await engine.dispose()

    asyncio.run(request(fail=True))
    asyncio.run(request(fail=False))
    assert pg_box.store.job_find_by_key(KEY.format(1)) == []
    assert len(pg_box.store.job_find_by_key(KEY.format(2))) == 1


@pytest.mark.postgres
@pytest.mark.parametrize("on", ["own", "caller"])
def test_an_enqueue_waiting_on_a_lock_leaves_the_event_loop_running(pg_box: Box, on: str):
    # Another transaction enqueues the same key and holds it: the awaited enqueue waits on the
    # key's unique index. The loop must keep running meanwhile — the blocker is committed from
    # the loop itself, after it has ticked, so a blocked loop would never get there.
    blocker = psycopg.connect(conninfo(pg_box))
    pg_box.enqueue("weekly_digest", **ARGS, connection=blocker)

    async def request() -> tuple[bool, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        running = asyncio.create_task(ticker())
        async with await psycopg.AsyncConnection.connect(conninfo(pg_box)) as conn:
            pending = asyncio.create_task(
                pg_box.aio.enqueue(
                    "weekly_digest", **ARGS, connection=conn if on == "caller" else None
                )
            )
            while ticks < 20:  # the enqueue is waiting on the lock all this time
                await asyncio.sleep(0.01)
            assert not pending.done()
            await asyncio.to_thread(blocker.commit)
            result = await asyncio.wait_for(pending, 60)
            await conn.commit()
        running.cancel()
        return result.created, ticks

    try:
        created, ticks = asyncio.run(request())
    finally:
        blocker.close()
    assert created is False and ticks >= 20


def test_a_sync_connection_is_refused_by_the_awaitable_surface(box: Box):
    async def request() -> None:
        await box.aio.enqueue("weekly_digest", **ARGS, connection=object())

    # PostgreSQL names the async connections it takes; SQLite, the sync API that takes sqlite3
    expected = "AsyncConnection" if box.store.dialect == "postgres" else "sync API.*sqlite3"
    with pytest.raises(ConfigurationError, match=expected):
        asyncio.run(request())
