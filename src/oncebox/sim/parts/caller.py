"""Enqueue in the caller's transaction: the job commits or rolls back with the caller's work.

- `order(n)`, keyed `order/{n}`: its handler returns;
- actor: `enqueue-in-tx`, which opens its own connection (as an application does), begins a
  transaction, enqueues one job on it (`box.enqueue(..., connection=conn)`) and then, by the
  run's choice, commits or rolls back. On SQLite it takes the write lock first, and waits its
  turn at a yield point (`caller.waiting_turn`) while another writer holds it; the commit and
  the rollback are yield points too (`caller.commit`, `caller.rollback`: a crash there rolls
  the transaction back with the process's connection).

What must hold, after every step:

    T1  a rolled-back enqueue leaves no job, and every job of the task is one whose caller
        committed; a committed one is wanted (it must reach an end once faults stop, L1)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Body, Part, Rows, Stage, Starter
from oncebox.sim.scheduler import Crash

TASK = "order"


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
        return {"enqueue-in-tx": self._start}

    def _start(self) -> Body:
        """A new process's connection, opened when it first runs (in its own thread, so it
        dies with it: `YieldingStore.drop_sessions`)."""
        world = self.world
        state: dict[str, Any] = {}

        def round_() -> None:
            if "conn" not in state:
                conn = world.real.connect()
                world.store.keep_for_crash(conn)
                state["conn"] = conn
            self._enqueue(state["conn"])

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
        keys = {key for (key,) in rows(f"SELECT key FROM oncebox_jobs WHERE task = '{TASK}'")}
        found = []
        for key in sorted(keys & self.rolled_back):
            found.append(Violation("T1", f"{key}: its caller rolled back, and the job is there"))
        for key in sorted(keys - self.committed - self.rolled_back):
            found.append(Violation("T1", f"{key}: a job no caller has committed"))
        for key in sorted(self.committed - keys):
            found.append(Violation("T1", f"{key}: its caller committed, and there is no job"))
        return found
