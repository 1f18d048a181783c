"""`Box`: the user's handle — declare tasks, enqueue jobs, replay, cancel, work.

    box = oncebox.Box("sqlite:///digests.db")

    @box.task(key="weekly-digest/customer-{customer_id}/{period}",
              retry=oncebox.Retry(max_attempts=8))
    def weekly_digest(ctx, customer_id: int, period: str) -> None:
        ctx.connection.execute(...)   # commits with the claim, or not at all

    box.enqueue(weekly_digest, customer_id=42, period="2026-W33")
    box.work(until_idle=True)

Enqueue is checked before anything is written: the task exists, the arguments fit its
signature, are JSON, within the size limit, and render a valid key. Then one statement inserts
the job — unless the key already has an intent (the operation happened) or an active job (it is
queued, running or dead-lettered); then nothing is written and the result says which.
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar, overload

from oncebox.errors import ConfigurationError, InvalidState, NotFound
from oncebox.jobs.codec import DEFAULT_MAX_PAYLOAD_BYTES, decode_args, encode_args
from oncebox.jobs.keyguard import KeyGuard
from oncebox.jobs.periods import PeriodKind
from oncebox.jobs.retry import Retry
from oncebox.jobs.tasks import DEFAULT_QUEUE, DEFAULT_TIMEOUT, Registry, Task, make_task
from oncebox.lanes.assembly import build_consumer, worker_name
from oncebox.lanes.worker import Worker, WorkerConfig, WorkerResult
from oncebox.metrics import Metrics
from oncebox.operations import Operations, reason_text
from oncebox.outbox.channels import Channel, make_channel
from oncebox.outbox.dispatcher import DispatcherConfig, OutboxDispatcher
from oncebox.outbox.tokens import SECRET_SETTING, check_secret, new_secret, secret_from_env
from oncebox.outbox.writer import OutboxWriter
from oncebox.providers import DEFAULT_EMAIL_URL, Provider
from oncebox.queue.consumer import Consumer, ConsumerConfig
from oncebox.queue.transport import Transport
from oncebox.queue.watch import HandlerWatch
from oncebox.schedules.fanout import FanOutResult, run_schedule
from oncebox.schedules.schedule import CatchUp, Overlap, Schedule, ScheduleContext, make_schedule
from oncebox.schedules.ticker import ScheduleTicker
from oncebox.store import open_store
from oncebox.store.base import Audit, JobInsert, JobInsertMany, ScheduleRunRef, Store
from oncebox.timers.expiry_sweeper import ExpirySweeper
from oncebox.timers.sweeper import SweepContext, Sweeper, make_sweeper

log = logging.getLogger("oncebox")
MAX_DELAY = timedelta(days=100 * 366)
EARLIEST_RUN_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_RUN_AT = datetime(9000, 1, 1, tzinfo=UTC)
F = TypeVar("F", bound=Callable[..., Any])
RESERVED_ARGS = frozenset({"connection", "run_at", "delay", "priority"})
EnqueueReason = Literal["created", "active_job", "key_claimed"]


@dataclass(frozen=True)
class EnqueueResult:
    """What an enqueue did. `created` is False when the key was already taken; `reason` says by
    what: an active job — ready, leased or dead (`state` is its state, `job_id` its id) — or the
    key's claim: its intent, or a done job (`state` is 'claimed', `job_id` the job that claimed
    it, if known)."""

    job_id: int | None
    key: str | None
    created: bool
    state: str
    reason: EnqueueReason


@dataclass(frozen=True)
class EnqueueManyResult:
    created: int
    skipped: int
    job_ids: list[int]
    run_held: bool = True  # for a schedule's fan-out: False if another scheduler took it over


_PLAIN = (str, int)  # argument types whose JSON form renders the same key as the value itself


class Box(Operations):
    """The user's handle; see the module docstring."""

    def __init__(
        self,
        url: str | None = None,
        *,
        store: Store | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        seed: int | None = None,
        secret: str | None = None,
    ) -> None:
        url = url if url is not None else os.environ.get("ONCEBOX_DB")
        if store is None and not url:
            raise ConfigurationError(
                "no database: pass a URL (Box('sqlite:///oncebox.db')) or set ONCEBOX_DB"
            )
        self.metrics = Metrics()
        self.store: Store = (
            store if store is not None else open_store(str(url), metrics=self.metrics)
        )
        if store is not None:
            self.metrics = getattr(store, "metrics", self.metrics)
        self.where: str = getattr(self.store, "where", self.store.url)
        self.registry = Registry()
        self.max_payload_bytes = max_payload_bytes
        self.rng = random.Random(seed)
        self._channels: dict[str, Channel] = {}
        self._schedules: dict[str, Schedule] = {}
        self._sweepers: dict[str, Sweeper] = {}
        self._secret = check_secret(secret, "Box(secret=...)") if secret else None
        self._workers: list[Worker] = []
        self._workers_lock = threading.Lock()
        self.key_guard = KeyGuard(self.store, self.registry.all, self._schedules.values)

    # -- tasks ---------------------------------------------------------------------------------

    @overload
    def task(self, fn: F, /) -> Task: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        key: str | None = None,
        name: str | None = None,
        retry: Retry | None = None,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
        priority: int = 0,
        queue: str = DEFAULT_QUEUE,
        group_by: str | None = None,
        keep_intents: timedelta | None = None,
    ) -> Callable[[F], Task]: ...

    def task(
        self,
        fn: F | None = None,
        /,
        *,
        key: str | None = None,
        name: str | None = None,
        retry: Retry | None = None,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
        priority: int = 0,
        queue: str = DEFAULT_QUEUE,
        group_by: str | None = None,
        keep_intents: timedelta | None = None,
    ) -> Task | Callable[[F], Task]:
        """Declare a task. `key` is the business-key template (omit it for a plain at-least-once
        job); `group_by` names an argument whose value orders the task's queue (one job per
        group at a time, in enqueue order); `keep_intents` opts into pruning intents."""

        def register(handler: F) -> Task:
            task = make_task(
                handler,
                name=name,
                key=key,
                retry=retry,
                timeout=timeout,
                priority=priority,
                queue=queue,
                group_by=group_by,
                keep_intents=keep_intents,
            )
            clash = RESERVED_ARGS & set(task.signature.parameters)
            if clash:
                raise ConfigurationError(
                    f"task {task.name!r}: parameter(s) {', '.join(sorted(clash))} clash with "
                    "enqueue options; rename them or enqueue with box.enqueue_args(task, {...})"
                )
            self.registry.add(task)
            return task

        return register(fn) if fn is not None else register

    # -- enqueue -------------------------------------------------------------------------------

    def enqueue(
        self,
        task: Task | str | Callable[..., Any],
        /,
        *,
        connection: object | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        priority: int | None = None,
        **args: Any,
    ) -> EnqueueResult:
        """Enqueue one job; keyword arguments are the job's arguments."""
        return self.enqueue_args(
            task, args, connection=connection, run_at=run_at, delay=delay, priority=priority
        )

    def enqueue_args(
        self,
        task: Task | str | Callable[..., Any],
        args: Mapping[str, Any],
        *,
        connection: object | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        priority: int | None = None,
    ) -> EnqueueResult:
        """`enqueue` with the arguments as a mapping (for argument names that clash)."""
        resolved = self.registry.resolve(task)
        row = self._row(resolved, args)
        timing = _timing(run_at, delay)
        # inside the caller's SQLite transaction (which holds the write lock) the guard only reads
        self.key_guard.require_task(
            resolved, may_record=connection is None or self.store.dialect == "postgres"
        )
        job = JobInsert(
            task=resolved.name,
            key=row[0],
            queue=resolved.queue,
            args_json=row[1],
            priority=resolved.priority if priority is None else priority,
            group_key=row[2],
            max_attempts=resolved.retry.max_attempts,
            run_at=timing[0],
            delay=timing[1],
            max_age=resolved.retry.max_age,
        )
        for _ in range(3):
            job_id, created = self.store.job_insert(job, connection=connection)
            if created:
                self.metrics.count("jobs_enqueued")
                if connection is None:
                    self._wake_local()
                return EnqueueResult(job_id, job.key, True, "ready", "created")
            assert job.key is not None  # keyless jobs are always created
            conflict = self.store.job_enqueue_conflict(job.key, connection=connection)
            if conflict.found:
                self.metrics.count("enqueue_deduplicated")
                state = conflict.active_state
                if conflict.active_job_id is not None and state in ("ready", "leased", "dead"):
                    return EnqueueResult(
                        conflict.active_job_id, job.key, False, str(state), "active_job"
                    )
                claimed_by = conflict.intent_job_id or conflict.active_job_id
                return EnqueueResult(claimed_by, job.key, False, "claimed", "key_claimed")
            # the conflicting job ended (e.g. was cancelled) between the two statements: retry
        raise InvalidState(f"key {job.key!r} kept changing state while being enqueued; try again")

    def enqueue_many(
        self,
        task: Task | str | Callable[..., Any],
        args_list: Iterable[Mapping[str, Any]],
        *,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        priority: int | None = None,
        schedule_run: ScheduleRunRef | None = None,
    ) -> EnqueueManyResult:
        """Enqueue many jobs of one task as one set, in one transaction.

        One bad job means nothing is written: a job that fails its check rolls the whole set
        back, even on PostgreSQL, where jobs are checked and encoded as they are sent (the
        server inserts one chunk while the next is encoded). Jobs whose key is claimed or active
        are skipped (counted), like `enqueue` would.
        """
        resolved = self.registry.resolve(task)
        rows = (self._row(resolved, args) for args in args_list)
        timing = _timing(run_at, delay)
        self.key_guard.require_task(resolved)
        inserted = self.store.job_insert_many(
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
            )
        )
        created = inserted.created
        skipped = inserted.offered - len(created)
        self.metrics.count("jobs_enqueued", len(created))
        self.metrics.count("enqueue_deduplicated", skipped)
        if created:
            self._wake_local()
        return EnqueueManyResult(len(created), skipped, [c[0] for c in created], inserted.run_held)

    def _row(self, task: Task, args: Mapping[str, Any]) -> tuple[str | None, str, str | None]:
        """(key, encoded args, group key) for one job. The key and group are rendered from the
        arguments as stored — what every consumer and broker decodes — not from the caller's
        objects: a `(str, Enum)` member is stored as its value ("eu"), but `str()` of it is
        "Region.EU", and one operation must never render two keys."""
        task.check_args(args)
        encoded = encode_args(args, task.name, self.max_payload_bytes)
        if task.key is None and task.group_by is None:
            return None, encoded, None
        fields = (task.key.fields if task.key else ()) + ((task.group_by,) if task.group_by else ())
        # a plain str or int is stored as itself: only other values need the round trip
        plain = all(type(args.get(name)) in _PLAIN for name in fields)
        stored = args if plain else decode_args(encoded)
        return task.render_key(stored), encoded, task.group_of(stored)

    # -- the outbox ----------------------------------------------------------------------------

    def channel(
        self,
        name: str = "email",
        provider: Provider | str | None = None,
        **policies: Any,
    ) -> Channel:
        """Declare a channel (see `oncebox.channels`). Without a provider, `ONCEBOX_EMAIL` or
        the embedded default (`file://oncebox-outbox`) is used."""
        url = (
            provider if provider is not None else os.environ.get("ONCEBOX_EMAIL", DEFAULT_EMAIL_URL)
        )
        channel = make_channel(name, url, **policies)
        self._channels[name] = channel
        return channel

    @property
    def channels(self) -> dict[str, Channel]:
        """The declared channels; an `email` channel exists unless declared otherwise."""
        if "email" not in self._channels:
            self.channel("email")
        return dict(self._channels)

    def secret(self) -> str:
        """The HMAC secret outbox tokens are derived with: `Box(secret=...)`, else
        `ONCEBOX_SECRET`, else one stored in the database (`init_secret`)."""
        if self._secret is None:
            self._secret = secret_from_env() or self.store.setting_get(SECRET_SETTING)
        if self._secret is None:
            raise ConfigurationError(
                "no HMAC secret for outbox tokens: set ONCEBOX_SECRET (16+ random characters) "
                "on every worker, or store one in the database with box.init_secret()"
            )
        return self._secret

    def ensure_secret(self) -> str:
        """The secret; when none is configured anywhere, a random one stored in the database —
        which every process without `ONCEBOX_SECRET` then shares. Workers call this at start, so
        a missing secret never turns into a dead letter per message."""
        try:
            return self.secret()
        except ConfigurationError:
            stored = self.init_secret()
            log.info("stored a new HMAC secret for outbox tokens in %s", self.where)
            return stored

    def init_secret(self) -> str:
        """Store a random secret in the database unless one is there (every worker then agrees);
        an explicit or environment secret still wins."""
        stored = self.store.setting_put_if_absent(SECRET_SETTING, new_secret())
        self._secret = self._secret or secret_from_env() or stored
        return self._secret

    def outbox_writer(
        self, intent_key: str | None, job_id: int | None, written_at: datetime
    ) -> OutboxWriter:
        """`ctx.outbox` for one handler run; messages are dated `written_at` — the database's
        time when the job was leased (no query per message, and exact under a frozen clock)."""
        channels = self.channels
        return OutboxWriter(
            intent_key=intent_key,
            job_id=job_id,
            channels=channels,
            secret=self.secret,
            now=lambda: written_at,
        )

    def dispatcher(
        self, config: DispatcherConfig | None = None, *, name: str = "d0"
    ) -> OutboxDispatcher:
        """A dispatcher lane for `run_once()` in tests and tools."""
        return OutboxDispatcher(
            self.store,
            self.channels,
            config or DispatcherConfig(),
            self.metrics,
            worker=worker_name(name),
            rng=self.rng,
        )

    # -- schedules and sweepers ----------------------------------------------------------------

    def schedule(
        self,
        name: str,
        *,
        cron: str,
        period: PeriodKind,
        task: Task | str,
        tz: str = "UTC",
        catch_up: CatchUp = "latest",
        catch_up_window: timedelta = timedelta(days=31),
        overlap: Overlap = "wait",
        grace: timedelta = timedelta(minutes=10),
        batch_size: int = 5000,
    ) -> Callable[[Callable[[ScheduleContext], Iterable[Mapping[str, Any]]]], Schedule]:
        """Declare a schedule over the decorated eligible-set callable (see `oncebox.schedule`),
        which yields one task-args mapping per eligible subject, for `ctx.period`."""

        def register(
            eligible: Callable[[ScheduleContext], Iterable[Mapping[str, Any]]],
        ) -> Schedule:
            declared = make_schedule(
                name,
                cron=cron,
                tz=tz,
                period=period,
                task=task.name if isinstance(task, Task) else task,
                eligible=eligible,
                catch_up=catch_up,
                catch_up_window=catch_up_window,
                overlap=overlap,
                grace=grace,
                batch_size=batch_size,
            )
            if name in self._schedules:
                raise ConfigurationError(f"two schedules are named {name!r}")
            self._schedules[name] = declared
            return declared

        return register

    @property
    def schedules(self) -> dict[str, Schedule]:
        return dict(self._schedules)

    def _schedule(self, name: str) -> Schedule:
        try:
            return self._schedules[name]
        except KeyError:
            known = ", ".join(sorted(self._schedules)) or "none"
            raise NotFound(f"no schedule named {name!r} (declared: {known})") from None

    def run_schedule(self, name: str, period: str) -> FanOutResult:
        """Fan out one period again: enqueues only keys with no intent and no active job."""
        schedule = self._schedule(name)
        self.key_guard.require_schedule(schedule)
        self.key_guard.require_task(self.registry.resolve(schedule.task))
        schedule.period.check(period)  # before anything is written
        self.store.schedule_state(schedule.name, schedule.grace)  # known to status from now on
        return run_schedule(self, schedule, period, worker_name("manual"))

    def pause_schedule(self, name: str, *, reason: str | None = None, actor: str = "api") -> None:
        """Stop fanning out; audited when a reason is given."""
        audit = None if reason is None else Audit(actor, reason_text(reason))
        self.store.schedule_state_pause(self._schedule(name).name, True, audit)

    def resume_schedule(self, name: str, *, reason: str | None = None, actor: str = "api") -> None:
        """Resume from now: fires that passed while paused are skipped. Audited when a reason is
        given."""
        audit = None if reason is None else Audit(actor, reason_text(reason))
        self.store.schedule_state_pause(self._schedule(name).name, False, audit)

    def ticker(self) -> ScheduleTicker:
        """The scheduler lane, for `run_once()` in tests and tools."""
        return ScheduleTicker(self, self._schedules, worker_name("scheduler"))

    def sweeper(
        self,
        name: str,
        *,
        every: timedelta = timedelta(seconds=30),
        batch_size: int = 100,
        timeout: timedelta = timedelta(seconds=60),
    ) -> Callable[[Callable[[SweepContext], int]], Sweeper]:
        """Declare a due-row sweeper (see `oncebox.sweeper`)."""

        def register(handler: Callable[[SweepContext], int]) -> Sweeper:
            declared = make_sweeper(
                name, handler, every=every, batch_size=batch_size, timeout=timeout
            )
            if name in self._sweepers:
                raise ConfigurationError(f"two sweepers are named {name!r}")
            self._sweepers[name] = declared
            return declared

        return register

    @property
    def sweepers(self) -> dict[str, Sweeper]:
        return dict(self._sweepers)

    def expiry_sweeper(
        self, name: str, lock_timeout: timedelta = timedelta(seconds=2)
    ) -> ExpirySweeper:
        """One sweeper's lane, for `run_once()` in tests and tools; `close()` it after."""
        try:
            return ExpirySweeper(self, self._sweepers[name], lock_timeout)
        except KeyError:
            raise NotFound(f"no sweeper named {name!r}") from None

    # -- working -------------------------------------------------------------------------------

    def work(
        self,
        *,
        until_idle: bool = False,
        concurrency: int = 1,
        queues: Iterable[str] | None = None,
        config: WorkerConfig | None = None,
    ) -> WorkerResult:
        """Run a worker in this thread until stopped (SIGTERM/SIGINT) or, with `until_idle`,
        until no job is due; returns what it consumed."""
        if config is None:
            config = WorkerConfig(
                concurrency=concurrency,
                queues=tuple(queues) if queues is not None else None,
                until_idle=until_idle,
            )
        return Worker(self, config).run()

    def consumer(
        self,
        config: ConsumerConfig | None = None,
        *,
        transport: Transport | None = None,
        watch: HandlerWatch | None = None,
        name: str = "c0",
    ) -> Consumer:
        """A single consumer lane (table queue unless `transport` is given), for `run_once()` in
        tests and tools. Close it with `consumer.session.close()`."""
        consumer, _transport = build_consumer(
            self,
            config or ConsumerConfig(),
            watch or HandlerWatch(exit_on_hang=False),
            name=name,
            transport=transport,
        )
        return consumer

    def attach_worker(self, worker: Worker) -> None:
        with self._workers_lock:
            self._workers.append(worker)

    def detach_worker(self, worker: Worker) -> None:
        with self._workers_lock:
            if worker in self._workers:
                self._workers.remove(worker)

    def _wake_local(self) -> None:
        with self._workers_lock:
            workers = list(self._workers)
        for worker in workers:
            worker.wake()

    def close(self) -> None:
        for channel in self._channels.values():
            closer = getattr(channel.provider, "close", None)
            if callable(closer):
                closer()
        self.store.close()

    def __enter__(self) -> Box:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timing(run_at: datetime | None, delay: timedelta | None) -> tuple[datetime | None, timedelta]:
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
