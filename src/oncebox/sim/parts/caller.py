"""Enqueue in the caller's transaction: the job commits or rolls back with the caller's work.

- `order(n)`, keyed `order/{n}`: its handler returns;
- actor: `enqueue-in-tx`, which opens its own connection (as an application does), begins a
  transaction, enqueues one job on it (`box.enqueue(..., connection=conn)`) and then, by the
  run's choice, commits or rolls back. On SQLite it takes the write lock first, and waits its
  turn at a yield point (`caller.waiting_turn`) while another writer holds it; the commit and
  the rollback are yield points too (`caller.commit`, `caller.rollback`: a crash there rolls
  the transaction back with the process's connection).

On PostgreSQL also `enqueue-in-tx-async`: an asyncio application's transaction on psycopg's
`AsyncConnection`, through `box.aio.enqueue_many` (one to three jobs; the store's insert sent in
chunks of two rows, as a batch past `INSERT_CHUNK` is). Each statement the call sends on the
caller's connection is a yield point (`caller.statement`), and there, now and then, the caller
gives up on the call (a client gone, a timeout: its task cancelled), and the statement reaches
the server late — after the caller's rollback, if it is sent at all. The caller then rolls back
and goes on with its next transaction on the same connection, where a statement the cancelled
call still sent would commit a job of a rolled-back enqueue.

What must hold, after every step:

    T1  a rolled-back enqueue leaves no job, and every job of the task is one whose caller
        committed; a committed one is wanted (it must reach an end once faults stop, L1)
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import psycopg

from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Body, Part, Rows, Stage, Starter, own_connection
from oncebox.sim.scheduler import Crash

TASK = "order"
CHUNK = 2  # rows a statement of the async caller's batch inserts (`store/postgres.py`)


class CallerTransactions(Part):
    """See the module docstring."""

    name = "caller"

    def __init__(self, world: Stage) -> None:
        self.world = world
        self.made = 0
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()

        @world.box.task(name=TASK, key="order/{n}")
        def order(ctx: JobContext, n: int) -> None:
            pass

        self.order = order

    def actors(self) -> Mapping[str, Starter]:
        actors: dict[str, Starter] = {"enqueue-in-tx": self._start}
        if self.world.real.dialect == "postgres":
            actors["enqueue-in-tx-async"] = self._start_async
        return actors

    def _start(self) -> Body:
        """A new process's connection, opened when it first runs (in its own thread, so it
        dies with it: `YieldingStore.drop_sessions`)."""
        world = self.world
        state: dict[str, Any] = {}

        def round_() -> None:
            self._enqueue(own_connection(world, state))

        return world.loop(round_)

    def _enqueue(self, conn: Any) -> None:
        """Now and then (one round in three): an application that holds SQLite's write lock
        while it is parked keeps every other writer waiting, and the world would do little
        else."""
        world = self.world
        if world.choices.below(3):
            return
        self.made += 1
        key = f"order/{self.made}"
        self._begin(conn)
        try:
            world.box.enqueue(self.order, n=self.made, connection=conn)
        except BaseException as exc:
            self.rolled_back.add(key)  # a crash's connection is closed: rolled back too
            if not isinstance(exc, Crash):
                conn.rollback()
            raise
        if world.choices.below(3) == 0:
            try:
                world.scheduler.point("caller.rollback")
            finally:  # a crash there rolls back as well, with the connection
                self.rolled_back.add(key)
            conn.rollback()
            return
        try:
            world.scheduler.point("caller.commit")
        except BaseException:
            self.rolled_back.add(key)  # the commit never ran
            raise
        conn.commit()
        self.committed.add(key)
        world.wanted.add(key)

    def _start_async(self) -> Body:
        """An asyncio application: its event loop and its `AsyncConnection` live in the actor's
        thread (the loop runs only while the actor holds the baton), and `box.aio`'s worker
        thread is the loop's one executor thread, so its statements are sent one at a time."""
        world = self.world
        state: dict[str, Any] = {}

        def round_() -> None:
            if "loop" not in state:
                state["loop"] = asyncio.new_event_loop()
                state["loop"].set_default_executor(ThreadPoolExecutor(1, "sim-aio"))
            loop: asyncio.AbstractEventLoop = state["loop"]
            if "conn" not in state:
                conn = loop.run_until_complete(_Cancelling.connect(world.real.conninfo))
                conn.caller = self
                world.store.keep_for_crash(_Severed(conn))
                state["conn"] = conn
            with _chunks(CHUNK):
                loop.run_until_complete(self._enqueue_async(state["conn"]))

        rounds = world.loop(round_)

        def body() -> None:
            try:
                rounds()
            finally:  # the process ends: its connection, its loop and its executor with it
                if "conn" in state:
                    _Severed(state["conn"]).close()
                if "loop" in state:
                    state["loop"].close()  # which shuts its executor down, not waiting

        return body

    async def _enqueue_async(self, conn: _Cancelling) -> None:
        """Every round: PostgreSQL's transactions wait for no write lock of the whole file."""
        world = self.world
        rows = [{"n": self.made + 1 + i} for i in range(1 + world.choices.below(3))]
        self.made += len(rows)
        keys = {f"order/{row['n']}" for row in rows}
        call = asyncio.ensure_future(world.box.aio.enqueue_many(self.order, rows, connection=conn))
        conn.awaiting = call
        try:
            await call
        except asyncio.CancelledError:  # the caller gave up on it: its transaction rolls back
            self.rolled_back.update(keys)
            await conn.rollback()
            await conn.after_rollback()
            return
        except BaseException as exc:
            self.rolled_back.update(keys)
            if not isinstance(exc, Crash):
                await conn.rollback()
            raise
        finally:
            conn.awaiting = None
            # what the call's thread still does (a cancel it ignored) ends within this round
            await asyncio.get_running_loop().run_in_executor(None, lambda: None)
        if world.choices.below(3) == 0:
            try:
                world.scheduler.point("caller.rollback")
            finally:
                self.rolled_back.update(keys)
            await conn.rollback()
            return
        try:
            world.scheduler.point("caller.commit")
        except BaseException:
            self.rolled_back.update(keys)
            raise
        await conn.commit()
        self.committed.update(keys)
        world.wanted.update(keys)

    def _begin(self, conn: Any) -> None:
        """SQLite: the write lock, taken without waiting in the driver (the holder may be
        parked: the wait is a yield point, so the others go on). PostgreSQL: the driver begins
        the transaction with the first statement."""
        if self.world.real.dialect != "sqlite":
            return
        conn.execute("PRAGMA busy_timeout=0")
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
            self.world.scheduler.point("caller.waiting_turn")

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        keys = {key for (key,) in rows(f"SELECT key FROM oncebox_all_jobs WHERE task = '{TASK}'")}
        found = []
        for key in sorted(keys & self.rolled_back):
            found.append(Violation("T1", f"{key}: its caller rolled back, and the job is there"))
        for key in sorted(keys - self.committed - self.rolled_back):
            found.append(Violation("T1", f"{key}: a job no caller has committed"))
        for key in sorted(self.committed - keys):
            found.append(Violation("T1", f"{key}: its caller committed, and there is no job"))
        return found


class _Cancelling(psycopg.AsyncConnection[Any]):
    """The async caller's connection: each statement `box.aio` sends on it is a yield point,
    where the caller may give up on the call. The statement then waits — a loop busy elsewhere
    — until the caller has rolled back (`after_rollback`): a call that honours the cancel never
    sends it; one that ignored it sends it into the caller's next transaction."""

    caller: CallerTransactions
    awaiting: asyncio.Future[Any] | None = None
    _late: asyncio.Event | None = None

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        world = self.caller.world
        world.scheduler.point("caller.statement")
        if self.awaiting is not None and world.choices.below(3) == 0:
            self.awaiting.cancel()
            self._late = asyncio.Event()
            await self._late.wait()  # cancelled here by a call that honours its cancel
        return await super().execute(query, params, **kwargs)

    async def after_rollback(self) -> None:
        if self._late is not None:
            self._late.set()
            self._late = None


class _Severed:
    """What a crash does to the async caller's connection: its socket closed, so the server
    rolls its transaction back (the loop that owns it died with the process)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    def close(self) -> None:
        if not self.conn.closed:
            self.conn.pgconn.finish()


@contextmanager
def _chunks(rows: int) -> Iterator[None]:
    """The PostgreSQL store's batch insert in statements of `rows` rows, for the round."""
    from oncebox.store import postgres  # noqa: PLC0415 (PostgreSQL worlds only)

    was, postgres.INSERT_CHUNK = postgres.INSERT_CHUNK, rows
    try:
        yield
    finally:
        postgres.INSERT_CHUNK = was
