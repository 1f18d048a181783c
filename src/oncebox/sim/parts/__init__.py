"""The world's parts: each declares its tasks on the box, its actors, the actors that keep running
once faults stop, and the invariants that are its own — so features join the simulation side by
side, each in its own module, without editing another's.

A part is built from the world (`World.__init__`, in `PARTS` order) and declares its tasks there
and then. The checker asks every part after every step (`after_step`) and once the world is
quiet (`quiet`), handing it `rows`: a read of the database on the checker's own connection,
between steps, with every actor parked. What a part's SQL reads must run on SQLite and on
PostgreSQL alike; anything a dialect spells differently is read plainly and worked out here, in
Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol, TypeVar

from oncebox.box import Box
from oncebox.sim.choices import Choices
from oncebox.sim.invariants import Violation
from oncebox.sim.providers import SimProvider
from oncebox.sim.scheduler import Crash, Scheduler
from oncebox.sim.yields import YieldingStore

T = TypeVar("T")

Body = Callable[[], None]
Starter = Callable[[], Body]  # how to start an actor (again, after a crash): a new body
Rows = Callable[[str], list[Any]]  # the checker's read: SQL in, rows out


class Stage(Protocol):
    """What a part is given of its world (`sim/world.py`'s `World`)."""

    box: Box
    choices: Choices
    scheduler: Scheduler
    real: Any  # the store itself, unwrapped (its dialect, its connections)
    store: YieldingStore
    wanted: set[str]  # the keys that must reach an end once faults stop (L1)
    providers: dict[str, SimProvider]  # each channel's simulated provider, by channel name
    # the committed enqueues of other parts' collapsing tasks that joined a pending job: the
    # durable `enqueue_collapsed` counts them with the `collapse` part's own (K2)
    collapsed_elsewhere: int

    def loop(self, round_: Callable[[], object]) -> Body: ...

    def clock_now(self) -> datetime: ...

    def variant_of(self, part: Callable[[Any], Part]) -> int: ...


class Part:
    """See the module docstring. `keep`: the actors of this part that must go on running in the
    quiet phase (the lanes that bring its jobs to an end); the others are stopped there."""

    name = "part"
    keep: tuple[str, ...] = ()
    variants = 1  # worlds of this part, told apart by the seed (`Stage.variant_of`; a power of 2)

    def actors(self) -> Mapping[str, Starter]:
        return {}

    def after_step(self, rows: Rows) -> list[Violation]:
        return []

    def quiet(self, rows: Rows) -> list[Violation]:
        return []

    def faults_stop(self) -> None:
        """The quiet phase begins (faults off): a part starts checking what holds only then."""

    def time_passed(self) -> None:
        """The clock has moved: what the processes' own background threads did meanwhile (a
        renewal every few seconds), done within the clock's step, on the store itself — a
        thread that beats every 10 s has beaten through a 10-minute move, unless its process
        was stalled."""

    def counted(self, rows: Rows) -> dict[str, tuple[int, int]]:
        """What this part's lanes count with no job row to recount it from (C1), by counter:
        at least, at most."""
        return {}

    def unfinished(self, rows: Rows) -> int:
        """What of this part's is not at an end yet, beyond jobs and messages (a fan-out still
        running, a broker's messages): the quiet phase goes on while any part has some."""
        return 0


def own_connection(world: Stage, state: dict[str, Any]) -> Any:
    """The connection an application's process opens for itself, as its actor first runs (in
    its own thread, so it dies with it: closed, its transaction rolled back, when it crashes)."""
    if "conn" not in state:
        state["conn"] = world.real.connect()
        world.store.keep_for_crash(state["conn"])
    return state["conn"]


def in_own_transaction(world: Stage, conn: Any, work: Callable[[], T]) -> tuple[bool, T]:
    """`work` in the application's transaction on `conn`, then, by the run's choice, its commit
    (two times in three) or its rollback: whether it committed, and what `work` returned. A
    failure rolls it back; a crash leaves that to the connection's close."""
    try:
        done = work()
    except BaseException as exc:
        if not isinstance(exc, Crash):
            conn.rollback()
        raise
    if world.choices.below(3) == 0:
        conn.rollback()
        return False, done
    conn.commit()
    return True, done


def args_of(stored: Any) -> dict[str, Any]:
    """A job's arguments as either store returns them (JSON text, or already decoded)."""
    value = json.loads(stored) if isinstance(stored, (str, bytes)) else stored
    return dict(value)
