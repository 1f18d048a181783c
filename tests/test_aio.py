"""The awaitable surface (`box.aio`): what a web request does — enqueue, enqueue many, cancel, a
key's receipts — awaited without blocking the event loop, in the caller's async transaction when
it hands one over (psycopg's AsyncConnection, SQLAlchemy's AsyncSession or AsyncConnection)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg.abc import Params, QueryNoTemplate
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from oncebox import Box
from oncebox.chaos.mutations import mutated
from oncebox.kernel.errors import ConfigurationError
from oncebox.store import postgres
from oncebox.store.postgres import PostgresStore
from oncebox.store.sqlfiles import load_queries
from support.apps import digest_box
from support.waiting import wait_until

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


# -- a cancelled call on the caller's connection ---------------------------------------------------


class Recorded(psycopg.AsyncConnection[Any]):
    """The caller's connection, noting each statement that reaches the server by its query name;
    the `hold`-th statement is kept back, before the server, until `release` is set."""

    names: dict[str, str]
    sent: list[str]
    calls: int
    hold: int
    held: asyncio.Event
    release: asyncio.Event

    def watch(self, box: Box, hold: int = 0) -> None:
        assert isinstance(box.store, PostgresStore)
        self.names = {sql: name for name, sql in load_queries("postgres", box.store.schema).items()}
        self.sent, self.calls, self.hold = [], 0, hold
        self.held, self.release = asyncio.Event(), asyncio.Event()

    async def execute(  # type: ignore[override]  # the store never sends a Template
        self,
        query: QueryNoTemplate,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool = False,
    ) -> psycopg.AsyncCursor[Any]:
        self.calls += 1
        if self.calls == self.hold:
            self.held.set()
            await self.release.wait()
        self.sent.append(self.names.get(str(query), str(query)[:40]))
        return await super().execute(query, params, prepare=prepare, binary=binary)


@dataclass(frozen=True)
class AfterCancel:
    """What a call cancelled mid-way left: the statements that reached the server after the
    cancel, its jobs committed by the caller's next transaction, and whether the caller's backend
    was still waiting on a lock when the cancel returned."""

    sent: list[str]
    jobs: int
    waiting: bool


CANCELLED_AT = (
    "between statements",
    "before a statement reaches the server",
    "in its own transaction",
    "on a lock",
)


def cancel_mid_enqueue(box: Box, at: str) -> AfterCancel:
    """An awaited enqueue on the caller's connection, its task cancelled `at`; the caller then
    rolls back, lets go whatever the call still had to send, and commits its next work on the
    same connection.

    - between statements: an enqueue of a taken key, its thread held after the insert found the
      key taken and before the read of who holds it;
    - before a statement reaches the server: three jobs in chunks of two, the second chunk's
      statement held back;
    - in its own transaction: the same on a connection in autocommit (the call's own block,
      which the caller has no way to roll back);
    - on a lock: an enqueue waiting on the key another transaction holds."""
    other = psycopg.connect(conninfo(box))
    paused, resume = threading.Event(), threading.Event()
    if at == "between statements":
        box.enqueue("weekly_digest", **ARGS)
        read = box.store.job_enqueue_conflict

        def held_read(key: str, connection: object | None = None) -> Any:
            paused.set()
            resume.wait(30)
            return read(key, connection=connection)

        box.store.job_enqueue_conflict = held_read  # type: ignore[method-assign]
    elif at == "on a lock":
        box.enqueue("weekly_digest", **ARGS, connection=other)  # held, not committed

    async def request() -> AfterCancel:
        conn = await Recorded.connect(conninfo(box))
        own = at == "in its own transaction"
        chunks = own or at == "before a statement reaches the server"
        conn.watch(box, hold=2 if chunks else 0)
        await conn.set_autocommit(own)
        try:
            args = [{"customer_id": c, "period": "2026-W33"} for c in (1, 2, 3)]
            task: asyncio.Future[Any] = asyncio.ensure_future(
                box.aio.enqueue_many("weekly_digest", args, connection=conn)
                if chunks
                else box.aio.enqueue("weekly_digest", **ARGS, connection=conn)
            )
            if at == "between statements":
                await asyncio.to_thread(paused.wait, 30)
            elif at == "on a lock":
                waiting = partial(waits_on_a_lock, other, conn)
                await asyncio.to_thread(wait_until, waiting, what="the enqueue's lock wait")
            else:
                await conn.held.wait()
            sent = len(conn.sent)
            task.cancel()
            # the held thread goes on: its next statement reaches the loop after the cancel has
            # reached the task (the loop runs callbacks in the order they were scheduled)
            resume.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert task.cancelled(), f"the cancelled enqueue answered {task.result()}"
            still_waiting = await asyncio.to_thread(waits_on_a_lock, other, conn)
            await asyncio.to_thread(other.rollback)
            if not own:
                await conn.rollback()
            conn.release.set()  # whatever the call still had to send goes now
            await asyncio.get_running_loop().shutdown_default_executor()  # its thread ended
            if not own:
                await conn.commit()  # the caller's next work, on the same connection
            return AfterCancel(conn.sent[sent:], 0, still_waiting)
        finally:
            await conn.close()

    try:
        after = asyncio.run(request())
    finally:
        other.close()
    jobs = sum(len(box.store.job_find_by_key(KEY.format(c))) for c in (1, 2, 3))
    return replace(after, jobs=jobs - (at == "between statements"))  # less the taken key's


def waits_on_a_lock(other: psycopg.Connection[Any], conn: psycopg.AsyncConnection[Any]) -> bool:
    found = other.execute(
        "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
        [conn.info.backend_pid],
    ).fetchone()
    return found is not None


@pytest.mark.postgres
@pytest.mark.parametrize("at", CANCELLED_AT)
def test_a_cancelled_enqueue_sends_nothing_on_the_callers_connection_after_the_cancel(
    pg_box: Box, at: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(postgres, "INSERT_CHUNK", 2)
    after = cancel_mid_enqueue(pg_box, at)
    assert after == AfterCancel(sent=[], jobs=0, waiting=False), (
        f"cancelled {at}: statements sent after the cancel {after.sent}, jobs committed by the "
        f"caller's next transaction {after.jobs}, still waiting on a lock {after.waiting}"
    )


@pytest.mark.postgres
def test_a_cancelled_enqueue_goes_on_without_its_check(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(postgres, "INSERT_CHUNK", 2)
    with mutated("aio-ignores-cancel"):
        box = digest_box(pg_url)
        try:
            after = cancel_mid_enqueue(box, "before a statement reaches the server")
        finally:
            box.close()
    assert (after.sent, after.jobs) == (["job_insert_many"], 1), after
