"""The key-drift guard: a deploy must not silently change the keys a task mints.

The guarantee rests on a key naming the same operation on every attempt, in every process, across
deploys and rollbacks. A refactor that turns `weekly-digest/customer-{customer_id}/{period}` into
`weekly-digest/{customer_id}/{period}`, or a schedule moved from `iso_week` in UTC to
`iso_week` in Europe/Berlin, mints keys that collide with nothing already claimed: the next re-run
sends every customer a second digest.

So each task's key template is rendered on fixed canary arguments, and each schedule's period
function on fixed canary instants (around ISO-year boundaries, month ends and the DST changes of
several zones). The outputs are recorded in the store the first time a process sees them. A
process whose code produces different outputs refuses to enqueue or run that task, or to fan out
that schedule (`KeyDrift`), until an operator accepts the change with
`oncebox keys accept NAME --reason …` — audited, and picked up by every process within a minute.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, Protocol

from oncebox.kernel import clock as kernel_clock
from oncebox.kernel.errors import KeyDrift, NotFound, StoreUnavailable
from oncebox.store.params import JobFilter, KeyCanary, reason_text

if TYPE_CHECKING:
    from oncebox.jobs.periods import PeriodKind
    from oncebox.jobs.tasks import Task
    from oncebox.store.protocol import Store

log = logging.getLogger("oncebox.keys")

Kind = Literal["task", "schedule"]
RECHECK_AFTER = 60.0  # seconds a verified canary is trusted before it is read again


class Schedule(Protocol):
    """What the guard reads of a schedule (`oncebox.schedules.schedule.Schedule`): its period
    function is guarded as a task's key template is. A protocol, so that the guard, which the
    schedules' lanes consult, does not depend on them."""

    @property
    def name(self) -> str: ...
    @property
    def tz(self) -> str: ...
    @property
    def period(self) -> PeriodKind: ...
    def period_of(self, fire: datetime) -> str: ...


def _utc(year: int, month: int, day: int, hour: int, minute: int) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


# Part of the stored format: outputs recorded by one version are compared with the next's, so this
# list is never edited, reordered or extended.
CANARY_INSTANTS: tuple[datetime, ...] = (
    # ISO week-years that differ from the calendar year, on both sides of midnight UTC
    _utc(2020, 12, 31, 23, 30),
    _utc(2021, 1, 3, 23, 30),
    _utc(2021, 1, 4, 0, 30),
    _utc(2025, 12, 28, 23, 30),
    _utc(2025, 12, 29, 0, 30),
    _utc(2026, 12, 31, 23, 30),
    _utc(2027, 1, 1, 12, 0),
    _utc(2027, 1, 3, 23, 30),
    _utc(2027, 1, 4, 0, 30),
    # month ends, a leap day
    _utc(2026, 1, 31, 23, 30),
    _utc(2026, 2, 28, 23, 30),
    _utc(2028, 2, 29, 12, 0),
    # DST changes: Europe (last Sundays of March and October, 01:00 UTC)
    _utc(2026, 3, 29, 0, 30),
    _utc(2026, 3, 29, 1, 30),
    _utc(2026, 10, 25, 0, 30),
    _utc(2026, 10, 25, 1, 30),
    # the United States (second Sunday of March, first of November)
    _utc(2026, 3, 8, 6, 30),
    _utc(2026, 3, 8, 7, 30),
    _utc(2026, 11, 1, 5, 30),
    _utc(2026, 11, 1, 6, 30),
    # the southern hemisphere (Sydney: first Sundays of April and October)
    _utc(2026, 4, 4, 15, 30),
    _utc(2026, 4, 4, 16, 30),
    _utc(2026, 10, 3, 15, 30),
    _utc(2026, 10, 3, 16, 30),
    # an ordinary Monday morning
    _utc(2026, 8, 10, 9, 0),
)


def task_canary(task: Task) -> KeyCanary | None:
    """The task's keys for two sets of canary arguments (text, then integers); None for a task
    without a key template (it mints no keys)."""
    if task.key is None:
        return None
    # Values come from the argument names, so swapping two placeholders, or rendering another
    # argument in a placeholder's place, changes the output; they are short, so any template
    # that can render a valid key renders its canaries.
    fields = task.key.fields
    outputs = []
    for values in (
        {field: field for field in fields},
        {field: 1000 + zlib.crc32(field.encode()) % 9000 for field in fields},
    ):
        try:
            outputs.append(task.key.render(values))
        except Exception as exc:  # a failure is an output too: it must not stop the worker
            outputs.append(f"!{type(exc).__name__}")
    return KeyCanary("task", task.name, task.key.source, tuple(outputs))


def schedule_canary(schedule: Schedule) -> KeyCanary:
    """The schedule's period for each canary instant, in the schedule's timezone."""
    outputs = []
    for instant in CANARY_INSTANTS:
        try:
            outputs.append(schedule.period_of(instant))
        except Exception as exc:  # a custom period function's failure is an output too
            outputs.append(f"!{type(exc).__name__}")
    return KeyCanary(
        "schedule", schedule.name, f"{schedule.period.name} in {schedule.tz}", tuple(outputs)
    )


@dataclass(frozen=True)
class Drift:
    """A recorded canary and this code's, which differ."""

    recorded: KeyCanary
    current: KeyCanary

    @property
    def label(self) -> str:
        return f"{self.current.kind}:{self.current.name}"

    def describe(self) -> str:
        inputs: Iterable[str] = (
            ("text args", "integer args")
            if self.current.kind == "task"
            else (i.isoformat().replace("+00:00", "Z") for i in CANARY_INSTANTS)
        )
        for given, was, now in zip(
            inputs, self.recorded.outputs, self.current.outputs, strict=False
        ):
            if was != now:
                what = "key template" if self.current.kind == "task" else "periods"
                return (
                    f"{self.current.kind} {self.current.name!r}: its {what} changed since "
                    f"{_when(self.recorded.recorded_at)} ({self.recorded.source!r} -> "
                    f"{self.current.source!r}; on {given} it gave {was!r}, now {now!r}): new keys "
                    "would not collide with keys already claimed. If intended, run `oncebox keys "
                    f"accept {self.label} --reason ...`"
                )
        return (
            f"{self.label}: its canaries changed ({self.recorded.source!r} -> "
            f"{self.current.source!r}); run `oncebox keys accept {self.label} --reason ...`"
        )


def _when(at: datetime | None) -> str:
    return "it was recorded" if at is None else at.strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True)
class CanaryStatus:
    """One task or schedule in `oncebox keys check`."""

    kind: Kind
    name: str
    status: Literal["ok", "new", "drifted", "not in code", "orphaned"]
    source: str
    detail: str = ""


def _kernel_monotonic() -> float:
    """The kernel's clock looked up at each read, not bound once: a clock put in its place (the
    simulation's virtual time) governs when a canary is read again."""
    return kernel_clock.monotonic()


class KeyGuard:
    """Verifies a box's tasks and schedules against the recorded canaries, with a short cache so
    the hot path (every enqueue, every lease) costs a dictionary look-up."""

    def __init__(
        self,
        store: Store,
        tasks: Callable[[], Iterable[Task]],
        schedules: Callable[[], Iterable[Schedule]],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self._tasks = tasks
        self._schedules = schedules
        self._clock = clock or _kernel_monotonic
        # (kind, name, what the code says): a redeclared template is checked afresh
        self._trusted_until: dict[tuple[str, str, str], float] = {}
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    # -- the hot path --------------------------------------------------------------------------

    def require_task(self, task: Task, *, may_record: bool = True) -> None:
        """Raise `KeyDrift` if this code's keys for `task` differ from the recorded ones.

        `may_record=False` (an enqueue inside the caller's SQLite transaction, which holds the
        write lock) reads but never writes: a first sighting is then recorded by the next
        process that can."""
        if task.key is None:
            return
        ident = ("task", task.name, task.key.source)
        if not self._trusted(ident):
            canary = task_canary(task)
            assert canary is not None
            self._verify(ident, canary, may_record)

    def require_schedule(self, schedule: Schedule) -> None:
        ident = (
            "schedule",
            schedule.name,
            f"{schedule.period.name}@{schedule.tz}#{id(schedule.period)}",
        )
        if not self._trusted(ident):
            self._verify(ident, schedule_canary(schedule), may_record=True)

    def allowed(self, task_names: Iterable[str]) -> list[str]:
        """The names among `task_names` this process may run (drifted tasks are left out, and
        reported once)."""
        by_name = {task.name: task for task in self._tasks()}
        allowed = []
        for name in task_names:
            task = by_name.get(name)
            try:
                if task is not None:
                    self.require_task(task)
            except KeyDrift as refused:
                self.report(refused)
                continue
            except StoreUnavailable:
                raise
            except Exception as exc:  # one task's problem must not stop the others
                self.report(KeyDrift(f"task {name!r}: its canaries could not be checked: {exc}"))
                continue
            allowed.append(name)
        return allowed

    def forget(self) -> None:
        """Read the store again on next use (what happens anyway a minute after a check)."""
        with self._lock:
            self._trusted_until.clear()

    def _trusted(self, ident: tuple[str, str, str]) -> bool:
        with self._lock:
            return self._trusted_until.get(ident, 0.0) > self._clock()

    def _verify(self, ident: tuple[str, str, str], canary: KeyCanary, may_record: bool) -> None:
        recorded = self.store.key_canary_get(canary.kind, canary.name)
        if recorded is None:
            if not may_record:
                return
            recorded = self.store.key_canary_record(canary)
        if recorded.outputs != canary.outputs:
            raise KeyDrift(Drift(recorded, canary).describe())
        with self._lock:
            self._trusted_until[ident] = self._clock() + RECHECK_AFTER

    def report(self, refused: KeyDrift) -> None:
        """Log a refusal a lane made on its own (nobody else would see it), once per drift."""
        with self._lock:
            if str(refused) in self._reported:
                return
            self._reported.add(str(refused))
        log.error("refusing %s", refused)

    # -- operators -----------------------------------------------------------------------------

    def current(self) -> dict[tuple[str, str], KeyCanary]:
        canaries: dict[tuple[str, str], KeyCanary] = {}
        for task in self._tasks():
            canary = task_canary(task)
            if canary is not None:
                canaries[("task", task.name)] = canary
        for schedule in self._schedules():
            canaries[("schedule", schedule.name)] = schedule_canary(schedule)
        return canaries

    def check(self) -> list[CanaryStatus]:
        """Every task and schedule of this code against the store, read-only."""
        recorded: dict[tuple[str, str], KeyCanary] = {
            (c.kind, c.name): c for c in self.store.key_canary_list()
        }
        statuses = []
        for ident, canary in sorted(self.current().items()):
            stored = recorded.pop(ident, None)
            if stored is None:
                statuses.append(CanaryStatus(canary.kind, canary.name, "new", canary.source))
            elif stored.outputs != canary.outputs:
                detail = Drift(stored, canary).describe()
                statuses.append(
                    CanaryStatus(canary.kind, canary.name, "drifted", canary.source, detail)
                )
            else:
                statuses.append(CanaryStatus(canary.kind, canary.name, "ok", canary.source))
        statuses += [self._gone(stored) for _ident, stored in sorted(recorded.items())]
        return statuses

    def _gone(self, stored: KeyCanary) -> CanaryStatus:
        """A recorded task or schedule this code lacks; `orphaned` when jobs of that task wait
        in a queue this code consumes (a rename leaves them `ready` forever). Other apps sharing
        the database, on their own queues, are not this code's business."""
        queues = sorted({task.queue for task in self._tasks()})
        if stored.kind == "task":
            waiting = [
                job
                for queue in queues
                for state in ("ready", "leased", "relayed")
                for job in self.store.job_list(
                    JobFilter(state=state, task=stored.name, queue=queue, limit=1)
                )
            ]
            if waiting:
                return CanaryStatus(
                    "task",
                    stored.name,
                    "orphaned",
                    stored.source,
                    f"task {stored.name!r}: jobs of it are waiting (e.g. job {waiting[0].id}) and "
                    "this code has no task of that name to run them. A task's name is stored with "
                    "its jobs and intents: renaming one is a data migration, not a refactor.",
                )
        return CanaryStatus(stored.kind, stored.name, "not in code", stored.source)

    def resolve(self, name: str) -> KeyCanary:
        """This code's canary for `task:NAME`, `schedule:NAME`, or a bare NAME that names exactly
        one task or schedule."""
        current = self.current()
        kind, sep, rest = name.partition(":")
        if sep and kind in ("task", "schedule"):
            if (kind, rest) not in current:
                raise NotFound(f"this code has no {kind} {rest!r} whose keys could be accepted")
            return current[(kind, rest)]
        matches = [canary for (_kind, found), canary in current.items() if found == name]
        if not matches:
            raise NotFound(f"this code has no task or schedule named {name!r} that mints keys")
        if len(matches) > 1:
            raise NotFound(f"{name!r} is a task and a schedule: say task:{name} or schedule:{name}")
        return matches[0]

    def accept(self, name: str, actor: str, reason: str) -> int | None:
        """Record this code's canaries for `name`, audited; None when they already match."""
        reason = reason_text(reason)
        canary = self.resolve(name)
        stored = self.store.key_canary_get(canary.kind, canary.name)
        if stored is not None and stored.outputs == canary.outputs:
            return None
        audit_id = self.store.key_canary_accept(canary, actor, reason)
        self.forget()
        return audit_id
