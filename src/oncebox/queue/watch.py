"""Handler run times: what is running where, and the watchdog for handlers that never return.

Python cannot interrupt a thread, so a handler that hangs cannot be stopped from the inside. The
watchdog bounds it from the outside: once a handler has run `timeout + grace`, the worker process
exits (code 70) after logging which task and key hung — its leases expire and the rescuer hands
the jobs to a healthy worker. On SQLite this is the only way to free the single write lock the
hung transaction holds; on PostgreSQL the server also ends the session on its own
(`idle_in_transaction_session_timeout`), releasing the claim's locks even if the process is frozen.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from datetime import timedelta

from oncebox.kernel import clock

log = logging.getLogger("oncebox.watchdog")
EXIT_HUNG_HANDLER = 70


@dataclass(slots=True)  # per job: see `oncebox.store.records.LeasedJob`
class Running:
    task: str
    key: str | None
    started: float
    timeout: float
    token: str | None = None


class HandlerWatch:
    """Which handlers run in which thread, since when, with which timeout."""

    def __init__(self, grace: timedelta = timedelta(seconds=10), exit_on_hang: bool = True) -> None:
        self.grace_delta = grace
        self.grace = grace.total_seconds()
        self.exit_on_hang = exit_on_hang
        self._running: dict[int, Running] = {}  # thread id -> its handler (see `begin`)

    def running(
        self, task: str, key: str | None, timeout: timedelta, token: str | None = None
    ) -> _Marked:
        """Mark a handler as running in this thread, under the lease `token` it works for."""
        return _Marked(self, Running(task, key, clock.monotonic(), timeout.total_seconds(), token))

    def begin(self, run: Running) -> int:
        """`running` without a context manager, for the consumer's per-job path: mark `run`
        as this thread's handler; returns the thread's id, for `end`. No lock: setting and
        popping one dictionary item are atomic, and `overdue` copies the values at once."""
        ident = threading.get_ident()
        self._running[ident] = run
        return ident

    def end(self, ident: int) -> None:
        """The handler marked by `begin` returned (or raised)."""
        self._running.pop(ident, None)

    def overdue(self, grace: float = 0.0) -> list[Running]:
        now = clock.monotonic()
        runs = list(self._running.values())  # one C call: atomic beside the marking threads
        return [r for r in runs if now - r.started > r.timeout + grace]

    def check(self) -> list[Running]:
        """Handlers past timeout + grace; exits the process if configured to."""
        hung = self.overdue(self.grace)
        for run in hung:
            log.critical(
                "handler of task %s (key %s) has run %.0fs, past its %.0fs timeout and %.0fs "
                "grace; %s",
                run.task,
                run.key,
                clock.monotonic() - run.started,
                run.timeout,
                self.grace,
                "ending this worker process" if self.exit_on_hang else "exit disabled",
            )
        if hung and self.exit_on_hang:
            logging.shutdown()
            os._exit(EXIT_HUNG_HANDLER)
        return hung


class _Marked:
    """`with watch.running(...)`: a plain class, not a generator — it wraps every handler call."""

    __slots__ = ("_ident", "_run", "_watch")

    def __init__(self, watch: HandlerWatch, run: Running) -> None:
        self._watch = watch
        self._run = run
        self._ident = 0

    def __enter__(self) -> None:
        self._ident = self._watch.begin(self._run)

    def __exit__(self, *exc: object) -> None:
        self._watch.end(self._ident)
