"""Which tasks are limited, as the processes sharing a store declare them — so that a worker
un-limits a job only when the store knows its task is no longer limited.

A job of a limited task carries its partition (`limit_key`), and only the limited lease takes
such a job. A worker whose code declares the task without limits hands its jobs back to the
unlimited lease (`job_unlimit`, in every pass of the lease rescuer): the way out when a deploy
removes a limit. But during a rolling deploy that adds one, the old release's workers know the
task without limits too, and a worker cannot tell from its code which release is the newer. The
store can tell whether any process still declares the limit:

- every process whose code limits a task records it (the limits as declared, and the time):
  before it enqueues the task's jobs (at most once a `REFRESH_EVERY` per task, as the key guard
  rechecks its canaries; in the caller's SQLite transaction, with each enqueue) and with each
  beat of its worker (every 10 s, all its limited tasks). A process whose code has no limit for
  the task never writes, so an old worker (re)starting mid-deploy cannot undo the record;
- a worker un-limits a task's jobs only when no process has declared the task limited within
  `LAPSE` — checked in the un-limiting statement itself, so a declaration recorded after the
  worker chose its tasks still stops it, and a job it can see was enqueued after a
  declaration it sees too.

So adding a limit: the old workers leave the new release's jobs `ready` for the new workers
(they never lease a job that carries a partition). Removing one, or rolling back the release
that added it: the jobs that already carry a partition wait until no process has declared the
limit for `LAPSE`, then the next rescuer pass of a worker that knows the task without limits
(every 15 s) frees them; once no process has declared it for `QUIET`, `status` lists them and
says when that will be. The bound is a trade: a deploy that stalls for longer than `LAPSE`
after a process of the new release enqueued (no worker of that release running, no enqueue of
the task since), or a store outage that long mid-deploy, lets an old worker's rescuer free
those jobs before the new release declares the limit again; they then run as the old release
would have run them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from oncebox.kernel.clock import monotonic
from oncebox.limits.waiting import CAP, PARTITIONS, Read
from oncebox.store.params import LimitDeclaration

if TYPE_CHECKING:
    from oncebox.jobs.tasks import Task
    from oncebox.store.protocol import Store

# How long a declaration holds a task's limited jobs after the last process declared it: 60
# beats of a worker, ten refreshes of an enqueuing process.
LAPSE = timedelta(minutes=10)
REFRESH_EVERY = 60.0  # seconds an enqueuing process trusts its last declaration of a task
# A declaration no process refreshed for this long is one no live process makes (workers
# refresh theirs every 10 s; an enqueuing process, every minute while it enqueues).
QUIET = timedelta(seconds=3 * REFRESH_EVERY)


def declaration_of(task: Task) -> LimitDeclaration | None:
    return None if task.limits is None else LimitDeclaration(task.name, task.limits.declaration())


class LimitDeclarations:
    """This process's declarations of its limited tasks, with a short cache so an enqueue costs
    a write at most once a `REFRESH_EVERY` per task."""

    def __init__(
        self,
        store: Store,
        tasks: Callable[[], Iterable[Task]],
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.store = store
        self._tasks = tasks
        self._clock = clock
        self._fresh_until: dict[tuple[str, str], float] = {}  # (task, its limits) -> until
        self._lock = threading.Lock()

    def before_enqueue(self, task: Task, connection: object | None = None) -> None:
        """Declare `task`'s limits before its jobs are written. Inside the caller's SQLite
        transaction (which holds the write lock) the declaration is written there, with the
        jobs — every time, as that transaction may yet roll back."""
        declared = declaration_of(task)
        if declared is None:
            return
        if connection is not None and self.store.dialect == "sqlite":
            self.store.limit_declare([declared], connection=connection)
            return
        ident = (declared.task, declared.limits)
        with self._lock:
            if self._fresh_until.get(ident, 0.0) > self._clock():
                return
        self.store.limit_declare([declared])
        with self._lock:
            self._fresh_until[ident] = self._clock() + REFRESH_EVERY

    def declare_all(self) -> None:
        """Every limited task of this code, now: a worker's start and beats."""
        declared = [d for d in map(declaration_of, self._tasks()) if d is not None]
        self.store.limit_declare(declared)
        until = self._clock() + REFRESH_EVERY
        with self._lock:
            self._fresh_until.update({(d.task, d.limits): until for d in declared})


@dataclass(frozen=True)
class QuietLimit:
    """A task whose ready jobs carry a partition of limits no process has declared lately:
    they wait for a worker whose code limits the task, or until `freed_at`, when a worker
    whose code runs the task without limits hands them to the unlimited lease."""

    task: str
    limits: str  # as last declared: "task:concurrency 1 at once, ..."
    declared_at: datetime
    waiting: int  # due jobs counted (at most CAP per partition)
    capped: bool
    freed_at: datetime


def quiet_limits(
    declared: Iterable[LimitDeclaration], read: Read, now: datetime
) -> list[QuietLimit]:
    """For `status`: the tasks declared limited, but not for `QUIET`, with jobs still held by
    those limits; `read` is the store's `job_limited_waiting` (bounded, as `waiting.py` reads
    it)."""
    quiet = {
        d.task: d for d in declared if d.declared_at is not None and d.declared_at <= now - QUIET
    }
    if not quiet:
        return []
    found = read(sorted(quiet), CAP + 1, PARTITIONS)
    entries = []
    for task, declaration in sorted(quiet.items()):
        parts = [p for p in found if p.task == task and p.waiting]  # due jobs held back
        if not parts:
            continue
        assert declaration.declared_at is not None
        entries.append(
            QuietLimit(
                task=task,
                limits=_shown(declaration.limits),
                declared_at=declaration.declared_at,
                waiting=sum(min(p.waiting, CAP) for p in parts),
                capped=any(p.waiting > CAP for p in parts),
                freed_at=declaration.declared_at + LAPSE,
            )
        )
    return entries


def _shown(limits: str) -> str:
    try:
        rules = json.loads(limits)["limits"]
        return ", ".join(f"{name} {rule}" for name, rule in rules)
    except (ValueError, KeyError, TypeError):  # written by another release: shown as it is
        return limits
