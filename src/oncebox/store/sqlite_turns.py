"""Fair turns at SQLite's one write lock, between every oncebox process and thread of a file.

SQLite has no queue for its write lock: a writer that finds it taken sleeps in its busy handler
(1 ms, then longer, up to 100 ms between looks) and takes it only if it happens to be free when
it looks. A worker's consumer releases the lock and takes it again within microseconds, one
transaction after the other; so while it drains, another process's `oncebox enqueue` or the
worker's own lease keeper could look for ten seconds and never find the lock free ("database is
locked"). The embedded default must stay usable by the app that embeds it.

So writers take turns, through a folder beside the database (`<database>.writers`):

- every write first tries `BEGIN IMMEDIATE` without waiting; a writer that finds the lock taken
  leaves a file in the folder (its pid, thread and a nonce) while it waits, retrying every few
  milliseconds until its busy timeout;
- a *greedy* writer — one that takes the lock again and again, the consumer's lease and its
  transaction — first yields while others wait: it does not take the lock until the folder holds
  no file but its own, or `MAX_YIELD` has passed (so a steady stream of writers cannot starve it
  either).

The folder is only read while it exists and holds files, one `scandir` per greedy write. A file
left by a process that died while waiting is removed by the next greedy writer that sees it (its
pid is gone, or it is older than the busy timeout). PostgreSQL needs none of this: its row locks
queue, and a consumer holds no lock that blocks an enqueue.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oncebox.kernel import clock, points

MAX_YIELD = 0.25  # seconds a greedy writer waits for the others before it takes its turn
FIRST_RETRY = 0.001  # seconds between a waiting writer's first two looks at the lock
LAST_RETRY = 0.01  # ... growing to this; SQLite's own busy handler waits up to 100 ms
_nonces = itertools.count()


def _busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class WriterTurns:
    """See the module docstring. One per store; `begin(conn, greedy)` replaces a plain
    `BEGIN IMMEDIATE` on every write connection of the store."""

    def __init__(self, database: Path, busy_timeout: float) -> None:
        self.folder = Path(f"{database}.writers")
        self.busy_timeout = busy_timeout
        self._local = threading.local()

    def begin(self, conn: sqlite3.Connection, greedy: bool = False) -> None:
        """`BEGIN IMMEDIATE` on `conn`, taking turns. Raises the driver's error ("database is
        locked") once the busy timeout has passed."""
        if greedy:
            self._yield_to_waiters()
        if self._try(conn):
            return
        deadline = clock.monotonic() + self.busy_timeout
        pause = FIRST_RETRY
        pausing = threading.Event()  # never set: its wait is the pause between two looks
        with self._waiting():
            while True:
                if self._try(conn):
                    return
                if clock.monotonic() >= deadline:
                    raise sqlite3.OperationalError(
                        f"database is locked (no turn at the write lock within "
                        f"{self.busy_timeout:g} s)"
                    )
                points.reach("sqlite.waiting_turn")  # the simulation steps others here
                pausing.wait(pause)
                pause = min(pause * 2, LAST_RETRY)

    def _try(self, conn: sqlite3.Connection) -> bool:
        """One look at the lock, without SQLite's busy handler (it would sleep up to 100 ms
        between looks and miss a lock that is free for a moment); the handler stays for the
        rest (a reader's rare wait on a checkpoint)."""
        conn.execute("PRAGMA busy_timeout=0")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                return False
            raise
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return True

    @contextmanager
    def _waiting(self) -> Iterator[None]:
        name = f"{os.getpid()}.{threading.get_ident()}.{next(_nonces)}"
        path = self.folder / name
        try:
            self.folder.mkdir(exist_ok=True)
            path.touch()
        except OSError:  # a read-only folder: waiting still works, without the turn
            yield
            return
        self._local.mine = name
        try:
            yield
        finally:
            self._local.mine = None
            with contextlib.suppress(OSError):
                path.unlink()
            with contextlib.suppress(OSError):  # the last waiter out leaves no folder behind
                self.folder.rmdir()

    def _yield_to_waiters(self) -> None:
        """Wait while another writer waits for the lock, at most `MAX_YIELD`."""
        deadline = clock.monotonic() + MAX_YIELD
        pausing = threading.Event()
        while self._others_waiting() and clock.monotonic() < deadline:
            points.reach("sqlite.waiting_turn")
            pausing.wait(FIRST_RETRY)

    def _others_waiting(self) -> bool:
        mine = getattr(self._local, "mine", None)
        try:
            entries = list(os.scandir(self.folder))
        except OSError:  # no folder yet: nobody has ever waited
            return False
        now = None
        for entry in entries:
            if entry.name == mine or entry.name.endswith(".tmp"):
                continue
            pid = int(entry.name.split(".", 1)[0]) if entry.name.split(".", 1)[0].isdigit() else 0
            try:
                if now is None:
                    now = self._wall()
                stale = now - entry.stat().st_mtime > 2 * self.busy_timeout
            except OSError:
                continue  # gone meanwhile: that writer has its turn
            if stale or not _alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                continue
            return True
        return False

    @staticmethod
    def _wall() -> float:
        """The file system's time, to age waiter files (their mtime is wall-clock seconds)."""
        return clock.real_now().timestamp()
