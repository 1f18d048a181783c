"""One actor runs at a time, and the seed says which.

Each actor is a thread running real oncebox code (a lane's `run_once()`, an enqueue, an operator
action). It runs only while it holds the baton, and gives it back at every yield point — every
store call, every provider call, every pause — where it parks until the scheduler picks it again.
So however many threads exist, one executes at a time, and the order of their steps is the
sequence of the scheduler's choices: replaying the choices replays the run.

A choice can also be a fault, delivered to the actor where it resumes: a crash (`Crash`, a
`BaseException` the code under test does not catch, as a SIGKILL runs no handler: its open
transaction is rolled back as a dropped connection's is) or a lost connection (the store's own
`StoreUnavailable`, its transaction rolled back).

A statement can block in the database on a lock another, parked, actor holds (PostgreSQL's row
locks). The scheduler notices (`blocked`, asked when the running actor has not parked within a
moment) and goes on with the others; the blocked actor's call returns once the lock is freed, and
it parks right there, before any more of its code runs.

Only the running actor can free a lock (at its commit or rollback, or as its crash closes its
session), and the actor it frees then runs too, until it parks or blocks again. So every step
ends with the freed settled (`_settle`): the scheduler waits until each blocked actor has parked
or waits again, as the database says, before the checker reads or another actor moves. Between a
release and the end of the step, the freed actor and the running one do run at once; the running
actor's statements are over by then (its next one comes after a yield point), but an operation
that commits twice in one call (two statements in autocommit) is a window the scheduler does not
close.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from oncebox.kernel.errors import StoreUnavailable
from oncebox.sim.choices import Choices

Fate = Literal["go", "crash", "disconnect"]
WAIT_SLICE = 0.02  # seconds the scheduler waits for the running actor before asking if it blocks
STUCK_AFTER = 60.0  # seconds an actor may run between two yield points before the run fails
STEP_SECONDS = 0.001  # monotonic time a step takes
# The points where a fault may befall an actor: its store calls, its provider and broker calls.
FAULTY = ("store.", "session.", "tx.", "send.", "broker.")
# Where only a crash may: not a store call (a broker's own lost connection is its wire's choice)
CRASH_ONLY = ("send.", "broker.")
# A lost connection is a partition of its process from the store: the process's next store
# calls fail too, up to this many (by choice), while the others carry on. Its rounds end and
# begin again meanwhile, and what it meant to do at once after the outage waits (a give-back:
# by then its jobs may be rescued and leased by another, whose leases it must not touch).
PARTITION_CALLS = 4
# Where an actor waits for SQLite's write lock; while another holds it, it is not picked.
TURN = "waiting_turn"


class Crash(BaseException):
    """The actor's process dies at this point: nothing after it runs, no handler catches it."""


class Stuck(Exception):
    """An actor neither parked nor blocked in time: a real hang (or a missing yield point)."""


@dataclass
class Step:
    """One step of a run: who moved, from which point, and what befell it there."""

    index: int
    actor: str
    at: str
    fate: Fate

    def __str__(self) -> str:
        fate = "" if self.fate == "go" else f"  ** {self.fate} **"
        return f"{self.index:5d}  {self.actor:<14} {self.at}{fate}"


@dataclass
class _Actor:
    name: str
    body: Callable[[], None]
    thread: threading.Thread | None = None
    state: Literal["new", "parked", "running", "blocked", "done"] = "new"
    at: str = "start"
    fate: Fate = "go"
    resumed: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    crashed: bool = False  # once crashed, every later point raises at once: nothing more runs
    wakes: float = 0.0  # resting (`Scheduler.rest`) until the run's monotonic time reaches this
    cut_off: int = 0  # store calls still to fail: a lost connection's partition lasts a while


class Scheduler:
    """See the module docstring. `blocked()` says how many of this world's sessions wait on a
    lock now (None: the store cannot block, as SQLite's writers take turns at yield points)."""

    def __init__(
        self,
        choices: Choices,
        *,
        fault_rate: float = 0.03,
        blocked: Callable[[], int] | None = None,
        on_crash: Callable[[str], None] | None = None,
        write_lock_held: Callable[[], bool] | None = None,
    ) -> None:
        self.choices = choices
        self.fault_rate = fault_rate
        self.faults = True
        self._blocked_count = blocked
        self._write_lock_held = write_lock_held
        self.on_crash = on_crash
        self._actors: dict[str, _Actor] = {}
        self._cond = threading.Condition()
        self._local = threading.local()
        self.steps: list[Step] = []
        self.errors: list[tuple[str, BaseException]] = []
        self.elapsed = 0.0  # the run's monotonic time: a millisecond a step, never the host's

    def monotonic(self) -> float:
        """What `oncebox.kernel.clock.monotonic` reads during a run: pacing, budgets and
        deadlines measured in steps, so they decide the same way in every replay."""
        return self.elapsed

    # -- the actors' side --------------------------------------------------------------------

    def current(self) -> str | None:
        """The actor this thread runs (None outside any actor: the checker, the set-up)."""
        return getattr(self._local, "actor", None)

    def point(self, where: str) -> None:
        """Park here until the scheduler picks this actor again; then meet its fate. Outside an
        actor (set-up, the checker) a point is nothing."""
        actor: _Actor | None = getattr(self._local, "actor_state", None)
        if actor is None:
            return
        if actor.crashed:
            raise Crash(f"{actor.name} crashed")
        with self._cond:
            actor.at = where
            actor.state = "parked"
            actor.resumed.clear()
            self._cond.notify_all()
        actor.resumed.wait()
        fate, actor.fate = actor.fate, "go"
        if fate == "crash":
            actor.crashed = True
            raise Crash(f"{actor.name} crashed at {where}")
        if fate == "disconnect":
            raise StoreUnavailable(f"{actor.name} lost its connection at {where}")

    def rest(self, seconds: float) -> None:
        """Park until `seconds` of the run's monotonic time have passed: a paced lane's pause
        between rounds (the ticker's interval). A resting actor is not picked meanwhile, so its
        pause burns no steps — as a real lane's sleep takes no one else's time. Outside an actor
        it is nothing."""
        actor: _Actor | None = getattr(self._local, "actor_state", None)
        if actor is None:
            return
        actor.wakes = self.elapsed + seconds
        try:
            self.point("rest")
        finally:
            actor.wakes = 0.0

    def crash_here(self, why: str) -> None:
        """The running actor's process dies here, by its own code (a handler that takes its
        worker down): as a crash the scheduler chose, nothing of it runs after."""
        actor: _Actor | None = getattr(self._local, "actor_state", None)
        if actor is not None:
            actor.crashed = True
        raise Crash(why)

    def after(self, where: str) -> None:
        """Called when a store call returns: a call that blocked on a lock parks here, so its
        actor runs no further until it is picked again."""
        actor: _Actor | None = getattr(self._local, "actor_state", None)
        if actor is None:
            return
        if actor.crashed:
            raise Crash(f"{actor.name} crashed")
        with self._cond:
            blocked = actor.state == "blocked"
        if blocked:
            self.point(f"{where} (lock freed)")

    # -- the scheduler's side ----------------------------------------------------------------

    def spawn(self, name: str, body: Callable[[], None]) -> None:
        """Start an actor; it parks at `start` before running anything."""
        actor = _Actor(name, body)
        self._actors[name] = actor

        def run() -> None:
            self._local.actor = name
            self._local.actor_state = actor
            try:
                self.point("start")
                body()
            except Crash:
                if self.on_crash is not None:  # what dies with the process: its connections
                    self.on_crash(name)
            except BaseException as exc:
                actor.error = exc
                self.errors.append((name, exc))
            finally:
                with self._cond:
                    actor.state = "done"
                    self._cond.notify_all()

        actor.thread = threading.Thread(target=run, name=f"sim:{name}", daemon=True)
        actor.thread.start()
        with self._cond:
            if not self._cond.wait_for(lambda: actor.state in ("parked", "done"), STUCK_AFTER):
                raise Stuck(f"{name} never reached its first point")

    def alive(self, name: str) -> bool:
        actor = self._actors.get(name)
        return actor is not None and actor.state != "done"

    def moved(self) -> set[str]:
        """The actors whose store calls may have run in the last step: the one it moved, and
        those parked where a call that blocked returned (`after`: a lock the step freed lets
        the blocked call finish while the step ends, on PostgreSQL)."""
        with self._cond:
            freed = {n for n, a in self._actors.items() if a.at.endswith("(lock freed)")}
        return freed | ({self.steps[-1].actor} if self.steps else set())

    def runnable(self) -> list[str]:
        with self._cond:
            return sorted(name for name, a in self._actors.items() if a.state == "parked")

    def step(self, only: list[str] | None = None) -> Step | None:
        """Pick a parked actor (among `only`, if given) and run it to its next point. None when
        no actor can move."""
        names = self._movable([n for n in self.runnable() if only is None or n in only])
        if not names:
            return None
        actor = self._actors[names[self.choices.below(len(names))]]
        fate: Fate = "go"
        # a provider call cannot lose the store's connection: only a crash befalls it there
        store_call = not actor.at.startswith(CRASH_ONLY)
        faulty = self.faults and actor.at.startswith(FAULTY)
        if faulty and store_call and actor.cut_off:
            actor.cut_off -= 1
            fate = "disconnect"
        elif faulty and self.choices.chance(self.fault_rate):
            fate = "disconnect" if store_call and self.choices.below(2) else "crash"
            if fate == "disconnect":
                actor.cut_off = self.choices.below(PARTITION_CALLS)
        step = Step(len(self.steps), actor.name, actor.at, fate)
        self.steps.append(step)
        self.elapsed += STEP_SECONDS
        with self._cond:
            actor.fate = fate
            actor.state = "running"
            actor.resumed.set()
        self._await(actor)
        return step

    def _movable(self, names: list[str]) -> list[str]:
        """The actors a step can move: not one waiting for SQLite's write lock while another
        holds it — its step would look at the lock, find it taken and park where it was, a step
        in which nothing happens. (A real waiter's looks take no one else's time either.) If
        every actor waits, they are all left in: something outside them holds the lock. Nor one
        resting (`rest`) whose time has not come, unless every actor rests."""
        awake = [n for n in names if self._actors[n].wakes <= self.elapsed]
        names = awake or names
        if self._write_lock_held is None:
            return names
        waiting = [n for n in names if self._actors[n].at.endswith(TURN)]
        if not waiting or len(waiting) == len(names) or not self._write_lock_held():
            return names
        return [n for n in names if n not in waiting]

    def _await(self, actor: _Actor) -> None:
        """Wait until the running actor parks, ends, or blocks on a lock in the database; then
        until the actors its step freed have settled.

        The probe counts the world's sessions waiting on a lock; the blocked actors are among
        them, but one its step freed is not (it runs) until it parks or waits again. So more
        waiting sessions than blocked actors means the running actor waits too; fewer means a
        freed one is on its way, and the running actor is judged once it has arrived."""
        waited = 0.0
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: actor.state != "running", WAIT_SLICE):
                    break
            waited += WAIT_SLICE
            if self._blocked_count is not None:
                count = self._blocked_count()
                with self._cond:
                    still_blocked = sum(1 for a in self._actors.values() if a.state == "blocked")
                    if actor.state == "running" and count > still_blocked:
                        actor.state = "blocked"
                        break
            if waited > STUCK_AFTER:
                raise Stuck(f"{actor.name} ran {STUCK_AFTER:g} s without a yield point")
        self._settle()

    def _settle(self) -> None:
        """Wait until every blocked actor waits in the database (as many waiting sessions as
        blocked actors): none that a lock's release freed is still running."""
        if self._blocked_count is None:
            return
        waited = 0.0
        while True:
            with self._cond:
                blocked = sum(1 for a in self._actors.values() if a.state == "blocked")
            if blocked == 0 or self._blocked_count() == blocked:
                return
            with self._cond:  # an actor parking wakes this at once
                self._cond.wait(WAIT_SLICE)
            waited += WAIT_SLICE
            if waited > STUCK_AFTER:
                raise Stuck(f"an actor freed from a lock ran {STUCK_AFTER:g} s without parking")

    def settle_blocked(self) -> None:
        """Wait for blocked actors whose lock was freed to park (before the checker reads)."""
        self._settle()

    def stop_all(self, keep: tuple[str, ...] = ()) -> None:
        """End every actor but `keep`: each crashes where it is parked (its transaction rolled
        back, its place in the writers' queue given up). An actor blocked on another's lock is
        freed when that one's session closes, parks, and is crashed in the next round."""
        while True:
            with self._cond:
                parked = [
                    a for a in self._actors.values() if a.name not in keep and a.state == "parked"
                ]
            if not parked:
                break
            for actor in parked:
                with self._cond:
                    if actor.state != "parked":
                        continue
                    actor.fate = "crash"
                    actor.state = "running"
                    actor.resumed.set()
                self._await(actor)
        for actor in self._actors.values():
            if actor.thread is not None and actor.state == "done":
                actor.thread.join(STUCK_AFTER)
