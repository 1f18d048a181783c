"""Enqueue: check a job completely, then write it in one statement — or say why nothing was written.

Enqueue is checked before anything is written: the task exists, the arguments fit its
signature, are JSON, within the size limit, and render a valid key. Then one statement inserts
the job — unless the key already has an intent (the operation happened) or an active job (it is
queued, running or dead-lettered); then nothing is written and the result says which. Used by
`Box.enqueue*` and by the schedules' fan-out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from oncebox.brokers.brokered import (
    check_message_size,
    refuse_unbrokerable,
    refuse_unrecorded_store,
)
from oncebox.jobs.codec import decode_args, encode_args
from oncebox.jobs.tasks import Task
from oncebox.kernel.errors import ConfigurationError, InvalidState
from oncebox.kernel.tracing import current_context, enqueue_span
from oncebox.runtime.runtime import Runtime
from oncebox.store.params import (
    JOBS,
    OUTBOX,
    Collapsing,
    InsertRow,
    JobInsert,
    JobInsertMany,
    ScheduleRunRef,
)
from oncebox.store.records import ACTIVE_STATES

MAX_DELAY = timedelta(days=100 * 366)
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_RUN_AT = datetime(9000, 1, 1, tzinfo=UTC)
EnqueueReason = Literal["created", "active_job", "key_claimed", "collapsed"]
TaskRef = Task | str | Callable[..., Any]


@dataclass(frozen=True)
class EnqueueResult:
    """What an enqueue did. `created` is False when the key was already taken; `reason` says by
    what: an active job — ready, leased or dead (`state` is its state, `job_id` its id) — or the
    key's claim: its intent, or a done job (`state` is 'claimed', `job_id` the job that claimed
    it, if known). For a debounced or throttled task, 'collapsed': the enqueue joined the
    pending job `job_id` (`key` is that job's key after it)."""

    job_id: int | None
    key: str | None
    created: bool
    state: str
    reason: EnqueueReason

    def __str__(self) -> str:
        """One line for people, as `oncebox enqueue` prints it."""
        key = f" (key {self.key})" if self.key else ""
        if self.created:
            return f"job {self.job_id} enqueued{key}"
        if self.reason == "collapsed":
            return f"joined pending job {self.job_id}{key}"
        if self.reason == "active_job":
            return f"not enqueued: key {self.key} is held by job {self.job_id} ({self.state})"
        holder = f" by job {self.job_id}" if self.job_id is not None else ""
        return f"not enqueued: key {self.key} was already claimed{holder}"


@dataclass(frozen=True)
class EnqueueManyResult:
    created: int
    skipped: int
    job_ids: list[int]
    run_held: bool = True  # for a schedule's fan-out: False if another scheduler took it over


_PLAIN = (str, int)  # argument types whose JSON form renders the same key as the value itself


def enqueue(
    runtime: Runtime,
    task: TaskRef,
    args: Mapping[str, Any],
    *,
    connection: object | None = None,
    run_at: datetime | None = None,
    delay: timedelta | None = None,
    priority: int | None = None,
) -> EnqueueResult:
    """Enqueue one job (see the module docstring); inside the caller's transaction when
    `connection` is given."""
    resolved = runtime.registry.resolve(task)
    with enqueue_span(resolved.queue, resolved.name) as traced:
        result = _enqueue(
            runtime,
            resolved,
            args,
            connection=connection,
            run_at=run_at,
            delay=delay,
            priority=priority,
        )
        traced.set(
            messaging__message__id=None if result.job_id is None else str(result.job_id),
            oncebox__key=result.key,
            oncebox__enqueue=result.reason,
        )
        return result


def _enqueue(
    runtime: Runtime,
    resolved: Task,
    args: Mapping[str, Any],
    *,
    connection: object | None,
    run_at: datetime | None,
    delay: timedelta | None,
    priority: int | None,
) -> EnqueueResult:
    store = runtime.store
    row = job_row(runtime, resolved, args)
    timing = check_timing(run_at, delay)
    # inside the caller's SQLite transaction (which holds the write lock) the guard only reads
    runtime.key_guard.require_task(
        resolved, may_record=connection is None or store.dialect == "postgres"
    )
    relayed = relay_check(runtime, resolved)
    # before the job: a worker of a release without the task's limits then leaves it limited
    runtime.limit_declarations.before_enqueue(resolved, connection)
    collapse = resolved.collapse
    if collapse is not None and (run_at is not None or delay is not None):
        raise ConfigurationError(
            f"task {resolved.name!r} is {collapse.mode}d: its jobs run when the {collapse.mode} "
            "says, so enqueue them without run_at or delay"
        )
    job = JobInsert(
        task=resolved.name,
        key=row[0],
        queue=resolved.queue,
        args_json=row[1],
        priority=resolved.priority if priority is None else priority,
        group_key=row[2],
        limit_key=row[3],
        max_attempts=resolved.retry.max_attempts,
        run_at=timing[0],
        delay=timing[1],
        max_age=resolved.retry.max_age,
        trace_context=current_context(),
        # the debounce key from the arguments as stored, as the key is (`job_row`)
        collapse=None if collapse is None else collapsing(resolved, decode_args(row[1])),
        relayed=relayed,
    )
    for _ in range(3):
        if job.collapse is not None:
            merged = store.job_merge(job, connection=connection)
            if merged is not None:
                runtime.metrics.count("enqueue_collapsed")
                return EnqueueResult(merged[0], merged[1], False, "ready", "collapsed")
        job_id, created = store.job_insert(job, connection=connection)
        if created:
            runtime.metrics.count("jobs_enqueued")
            if connection is None:
                runtime.workers.wake(OUTBOX if relayed else JOBS)
            return EnqueueResult(
                job_id, job.key, True, "relayed" if relayed else "ready", "created"
            )
        if job.key is None:  # a pending job of its debounce key was just made: join it
            continue
        conflict = store.job_enqueue_conflict(job.key, connection=connection)
        if conflict.found:
            runtime.metrics.count("enqueue_deduplicated")
            state = conflict.active_state
            if conflict.active_job_id is not None and state in ACTIVE_STATES:
                return EnqueueResult(
                    conflict.active_job_id, job.key, False, str(state), "active_job"
                )
            claimed_by = conflict.intent_job_id or conflict.active_job_id
            return EnqueueResult(claimed_by, job.key, False, "claimed", "key_claimed")
        # the conflicting job ended (e.g. was cancelled) between the two statements, or a
        # pending job of its debounce key was just made: retry
    what = f"key {job.key!r}" if job.key else f"the pending job of task {resolved.name!r}"
    raise InvalidState(f"{what} kept changing state while being enqueued; try again")


def relay_check(runtime: Runtime, task: Task) -> bool:
    """Whether a broker holds the task's queue — its jobs are then written `relayed`, and the
    relay publishes them — after refusing what such a queue cannot do (`brokers/brokered.py`)."""
    if task.queue not in runtime.brokers:
        return False
    refuse_unbrokerable(task)
    refuse_unrecorded_store(runtime.store.dialect)
    return True


def collapsing(task: Task, args: Mapping[str, Any]) -> Collapsing:
    """How an enqueue of a debounced or throttled task joins or makes its pending job."""
    collapse = task.collapse
    assert collapse is not None
    return Collapsing(
        key=collapse.key_of(task.name, args),
        throttle=collapse.mode == "throttle",
        window=collapse.window,
        max_wait=collapse.max_wait,
        keep_last=collapse.keep_last,
    )


def enqueue_many(
    runtime: Runtime,
    task: TaskRef,
    args_list: Iterable[Mapping[str, Any]],
    *,
    connection: object | None = None,
    run_at: datetime | None = None,
    delay: timedelta | None = None,
    priority: int | None = None,
    schedule_run: ScheduleRunRef | None = None,
) -> EnqueueManyResult:
    """Enqueue many jobs of one task as one set, in one transaction — the caller's, when
    `connection` is given.

    One bad job means nothing is written: a job that fails its check rolls the whole set
    back, even on PostgreSQL, where jobs are checked and encoded as they are sent (the
    server inserts one chunk while the next is encoded); in the caller's transaction every job
    is checked before the first is written. Jobs whose key is claimed or active are skipped
    (counted), like `enqueue` would.
    """
    resolved = runtime.registry.resolve(task)
    if resolved.collapse is not None:
        raise ConfigurationError(
            f"task {resolved.name!r} is {resolved.collapse.mode}d: enqueue its jobs one by one "
            "(each joins or makes the pending job of its debounce key)"
        )
    with enqueue_span(resolved.queue, resolved.name) as traced:
        result = _enqueue_many(
            runtime,
            resolved,
            args_list,
            connection=connection,
            run_at=run_at,
            delay=delay,
            priority=priority,
            schedule_run=schedule_run,
        )
        traced.set(
            messaging__batch__message_count=result.created + result.skipped,
            oncebox__created=result.created,
            oncebox__schedule=None if schedule_run is None else schedule_run.schedule,
            oncebox__period=None if schedule_run is None else schedule_run.period,
        )
        return result


def _enqueue_many(
    runtime: Runtime,
    resolved: Task,
    args_list: Iterable[Mapping[str, Any]],
    *,
    connection: object | None,
    run_at: datetime | None,
    delay: timedelta | None,
    priority: int | None,
    schedule_run: ScheduleRunRef | None,
) -> EnqueueManyResult:
    store = runtime.store
    rows = (job_row(runtime, resolved, args) for args in args_list)
    timing = check_timing(run_at, delay)
    runtime.key_guard.require_task(
        resolved, may_record=connection is None or store.dialect == "postgres"
    )
    relayed = relay_check(runtime, resolved)
    runtime.limit_declarations.before_enqueue(resolved, connection)  # before the jobs
    inserted = store.job_insert_many(
        JobInsertMany(
            task=resolved.name,
            queue=resolved.queue,
            priority=resolved.priority if priority is None else priority,
            max_attempts=resolved.retry.max_attempts,
            rows=rows,
            run_at=timing[0],
            delay=timing[1],
            max_age=resolved.retry.max_age,
            for_run=schedule_run,
            trace_context=current_context(),
            relayed=relayed,
        ),
        connection=connection,
    )
    created = inserted.created
    skipped = inserted.offered - len(created)
    runtime.metrics.count("jobs_enqueued", len(created))
    runtime.metrics.count("enqueue_deduplicated", skipped)
    if created and connection is None:
        runtime.workers.wake(OUTBOX if relayed else JOBS)
    return EnqueueManyResult(len(created), skipped, [c[0] for c in created], inserted.run_held)


def job_row(runtime: Runtime, task: Task, args: Mapping[str, Any]) -> InsertRow:
    """(key, encoded args, group key, limit key) for one job. The key, group and partition are
    rendered from the arguments as stored — what every consumer and broker decodes — not from
    the caller's objects: a `(str, Enum)` member is stored as its value ("eu"), but `str()` of it is
    "Region.EU", and one operation must never render two keys."""
    task.check_args(args)
    encoded = encode_args(args, task.name, runtime.max_payload_bytes)
    broker = runtime.brokers.get(task.queue)
    if broker is not None:
        check_message_size(broker, task, encoded)
    if task.key is None and task.group_by is None and task.limits is None:
        return None, encoded, None, None
    partition = task.limits.partition if task.limits else None
    fields = (
        (task.key.fields if task.key else ())
        + ((task.group_by,) if task.group_by else ())
        + (partition.fields if partition else ())
    )
    # a plain str or int is stored as itself: only other values need the round trip
    plain = all(type(args.get(name)) in _PLAIN for name in fields)
    stored = args if plain else decode_args(encoded)
    return task.render_key(stored), encoded, task.group_of(stored), task.limit_key_of(stored)


def check_timing(
    run_at: datetime | None, delay: timedelta | None
) -> tuple[datetime | None, timedelta]:
    if run_at is not None and delay is not None:
        raise ConfigurationError("give run_at or delay, not both")
    if run_at is not None and run_at.tzinfo is None:
        raise ConfigurationError(f"run_at {run_at.isoformat()} must be timezone-aware")
    if delay is not None and delay < timedelta(0):
        raise ConfigurationError("delay must not be negative")
    if delay is not None and delay > MAX_DELAY:
        raise ConfigurationError(f"delay must be at most {MAX_DELAY.days} days")
    if run_at is not None and not EARLIEST_RUN_AT <= run_at <= LATEST_RUN_AT:
        # an instant far outside this range sorts first (or last) in every lease query and
        # overflows on the way back: refused at the door
        raise ConfigurationError(
            f"run_at {run_at.isoformat()} is outside {EARLIEST_RUN_AT.year}-{LATEST_RUN_AT.year}"
        )
    return run_at, delay or timedelta(0)
