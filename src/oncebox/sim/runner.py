"""One run of one world: its actors stepped by the seed, the invariants read after every step,
then the faults stopped and the lanes run until nothing is due, and the end state checked.

A run is a function of its choices (`Choices`): the seed draws them and the run records them, so
`replay(record)` runs the same world again and `shrink.py` can look for a shorter record that
still fails.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncebox.chaos.mutations import drop_unique_claim, mutated
from oncebox.chaos.switches import refence_group_heads
from oncebox.kernel import clock, points
from oncebox.runtime import fanout, trigger
from oncebox.sim.choices import Choices
from oncebox.sim.invariants import Checker, Violation, postgres_version, sqlite_version
from oncebox.sim.scheduler import Scheduler, Step
from oncebox.sim.world import World
from oncebox.store import open_store, sqlite_turns

# The bound within which every key must reach an end state once faults stop: steps for each
# actor that runs on then (each step moves one of them, so the same work takes more steps among
# more actors): 3 060 for the 9 of the world before the `reports` part, 3 740 with its 11.
DRAIN_STEPS_PER_ACTOR = 340
TURN = "sqlite.waiting_turn"  # a SQLite writer waiting for the lock steps the others
RENEWERS = (fanout, trigger)  # the modules whose fan-out owners renew (`owners.renewing`)


@dataclass
class Outcome:
    """What a run found: its first violation (None: every invariant held), the step it was
    seen after, the steps taken and the choices made (enough to replay it)."""

    seed: int | None
    steps: list[Step]
    record: list[int]
    violation: Violation | None = None
    at: int | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.violation is not None

    def trace(self, around: int = 12) -> str:
        """The steps before the violation (or the last ones), one line each."""
        end = len(self.steps) if self.at is None else self.at + 1
        return "\n".join(str(step) for step in self.steps[max(0, end - around) : end])


def run(
    store: str = "sqlite",
    *,
    seed: int | None = None,
    record: list[int] | None = None,
    steps: int = 200,
    mutation: str | None = None,
) -> Outcome:
    """Run one world. `store`: "sqlite" (a new file) or a PostgreSQL URL (a new schema)."""
    choices = Choices(seed, record)
    with _database(store) as database, _mutation(mutation):
        scheduler = Scheduler(
            choices, blocked=database.blocked, write_lock_held=database.write_lock_held
        )
        outcome = Outcome(seed, scheduler.steps, choices.made)
        with _virtual_time(scheduler), _quiet(), points.installed({TURN: scheduler.point}):
            world = World(database.url, scheduler, choices)
            database.attach(world.real)
            _mutate_schema(world, mutation)
            version = sqlite_version if world.real.dialect == "sqlite" else postgres_version
            checker = Checker(world.real.connect(), world.parts, version)
            try:
                _play(world, scheduler, checker, outcome, steps)
            finally:
                scheduler.stop_all()
                _unmutate_schema(checker.connection, world.real.dialect, mutation)
                with contextlib.suppress(Exception):
                    checker.connection.close()
                world.close()
    return outcome


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """oncebox's own log lines say what the trace already shows: silenced for the run."""
    logger = logging.getLogger("oncebox")
    was = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(was)


@contextlib.contextmanager
def _virtual_time(scheduler: Scheduler) -> Iterator[None]:
    """The kernel's monotonic clock reads the run's steps, a SQLite writer waiting for its turn
    looks again at once (the others step meanwhile: `sqlite.waiting_turn`), and a fan-out
    owner's renewals are held off: they run in a thread of their own on the host's clock, which
    would write between the scheduler's steps (an owner is heard from through its batches, each
    extending its run). One simulation at a time in a process: these are the process's."""
    real = clock.monotonic
    retries = sqlite_turns.FIRST_RETRY, sqlite_turns.LAST_RETRY
    renewing = [getattr(module, "renewing") for module in RENEWERS]  # noqa: B009
    clock.monotonic = scheduler.monotonic
    sqlite_turns.FIRST_RETRY = sqlite_turns.LAST_RETRY = 0.0
    for module in RENEWERS:
        setattr(module, "renewing", _no_renewals)  # noqa: B010
    try:
        yield
    finally:
        clock.monotonic = real
        sqlite_turns.FIRST_RETRY, sqlite_turns.LAST_RETRY = retries
        for module, renew in zip(RENEWERS, renewing, strict=True):
            setattr(module, "renewing", renew)  # noqa: B010


@contextlib.contextmanager
def _no_renewals(*_run: object) -> Iterator[None]:
    """`owners.renewing` inside a run: no thread, no renewal."""
    yield


def _play(
    world: World, scheduler: Scheduler, checker: Checker, outcome: Outcome, steps: int
) -> None:
    starters = world.actors()
    for name, start in starters.items():
        scheduler.spawn(name, start())

    def check(found: list[Violation]) -> bool:
        if scheduler.errors:
            name, error = scheduler.errors[0]
            found = [Violation("E1", f"{name} raised {type(error).__name__}: {error}"), *found]
        if found:
            outcome.violation, outcome.at = found[0], len(scheduler.steps) - 1
            return True
        return False

    for _ in range(steps):
        if scheduler.step() is None:
            break
        for name, start in starters.items():
            if not scheduler.alive(name):  # crashed: a supervisor starts it again
                scheduler.spawn(name, start())
        if check(checker.after_step()):
            return
    world.quiet = True
    if not _drain(world, scheduler, checker, check, starters):
        check(checker.quiet(world.wanted))


def _drain(
    world: World,
    scheduler: Scheduler,
    checker: Checker,
    check: Callable[[list[Violation]], bool],
    starters: dict[str, Callable[[], Callable[[], None]]],
) -> bool:
    """Faults off, the enqueuers done: the lanes and the operator run until nothing is due.
    True when an invariant broke on the way. A lane that dies even so (a handler that takes
    its worker down) is started again, as before."""
    kept = world.kept()
    scheduler.faults = False
    checker.faults_stop()
    scheduler.stop_all(keep=kept)  # the others are done: nothing of theirs stays half-way
    for _ in range(DRAIN_STEPS_PER_ACTOR * len(kept)):
        if checker.unfinished() == 0:
            return False
        scheduler.step(only=list(kept))
        scheduler.settle_blocked()
        for name in kept:
            if name in starters and not scheduler.alive(name):
                scheduler.spawn(name, starters[name]())
        if check(checker.after_step()):
            return True
    return False


@contextlib.contextmanager
def _mutation(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    with mutated(name):
        yield


def _mutate_schema(world: World, mutation: str | None) -> None:
    """A mutation's schema part, on the world's database once migrated, before any actor runs:
    `no-unique-index` takes the intents' key from them (its query part alone would leave the
    primary key refusing the second claim)."""
    if mutation != "no-unique-index":
        return
    conn = world.real.connect()
    try:
        drop_unique_claim(conn, world.real.dialect)
    finally:
        conn.close()


def _unmutate_schema(conn: Any, dialect: str, mutation: str | None) -> None:
    """A PostgreSQL world's schema serves the process's next world (`sim/postgres.py`): the
    intents get their key back (their rows are the world's, emptied after it anyway), the relay
    trigger its head fence."""
    if dialect != "postgres" or mutation not in ("no-unique-index", "no-group-head-fence"):
        return
    if mutation == "no-group-head-fence":
        refence_group_heads(conn)
    else:
        conn.execute("DELETE FROM oncebox_intents")
        conn.execute(
            "ALTER TABLE oncebox_intents ADD CONSTRAINT oncebox_intents_pkey PRIMARY KEY (key)"
        )
    if not getattr(conn, "autocommit", True):
        conn.commit()


@dataclass(frozen=True)
class Database:
    """Where a world lives: its URL; how many of its sessions wait on a lock (None: SQLite,
    whose writers take turns at yield points); what its store needs before the actors start."""

    url: str
    blocked: Callable[[], int] | None = None
    attach: Callable[[Any], None] = lambda _store: None
    write_lock_held: Callable[[], bool] | None = None


@functools.cache
def _migrated_sqlite() -> Path:
    """A SQLite file migrated once per process, copied for each world: a world starts where a
    fresh migration would, for a copy's cost instead of the migration's (a third of a small
    world's)."""
    shm = Path("/dev/shm")  # noqa: S108 (a private folder is made inside it)
    folder = Path(
        tempfile.mkdtemp(prefix="oncebox-sim-template-", dir=shm if shm.is_dir() else None)
    )
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "template.db"
    store = open_store(f"sqlite:///{path}", migrate=True)
    store.close()
    conn = sqlite3.connect(path)
    try:  # one self-contained file: its write-ahead log folded in
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path


class _WriteLockProbe:
    """Whether some connection holds the SQLite file's write lock: a `BEGIN IMMEDIATE` that
    does not wait, rolled back at once (between steps, every actor parked)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None

    def held(self) -> bool:
        if self._conn is None:
            self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=0)
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                return True
            raise
        self._conn.execute("ROLLBACK")
        return False

    def __enter__(self) -> _WriteLockProbe:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._conn is not None:
            self._conn.close()


@contextlib.contextmanager
def _database(store: str) -> Iterator[Database]:
    """A new, empty database for one run: a SQLite file in a temporary folder, or an empty
    schema on the PostgreSQL server a URL names (`sim/postgres.py`)."""
    if store == "sqlite":
        # in memory where the host has it: the simulation tests orders, not the disk
        shm = Path("/dev/shm")  # noqa: S108 (a private folder is made inside it)
        with tempfile.TemporaryDirectory(
            prefix="oncebox-sim-", dir=shm if shm.is_dir() else None
        ) as folder:
            path = Path(folder) / "sim.db"
            shutil.copyfile(_migrated_sqlite(), path)
            with _WriteLockProbe(path) as probe:
                yield Database(
                    f"sqlite:///{path}?busy_timeout=3600&synchronous=normal",
                    write_lock_held=probe.held,
                )
        return
    from oncebox.sim.postgres import world_database  # noqa: PLC0415 (psycopg on use)

    with world_database(store) as (url, probe):
        yield Database(url, probe.waiting, probe.attach)
