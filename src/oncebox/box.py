"""`Box`: the user's handle — declare tasks, enqueue jobs, replay, cancel, work.

    box = oncebox.Box("sqlite:///digests.db")

    @box.task(key="weekly-digest/customer-{customer_id}/{period}",
              retry=oncebox.Retry(max_attempts=8))
    def weekly_digest(ctx, customer_id: int, period: str) -> None:
        ctx.connection.execute(...)   # commits with the claim, or not at all

    box.enqueue(weekly_digest, customer_id=42, period="2026-W33")
    box.work(until_idle=True)

The box is a façade: it declares into a `Runtime` (`runtime/runtime.py`) and hands that runtime to
the lanes it builds; enqueue is `runtime/enqueue.py`, the operator actions `runtime/operations.py`.
Nothing below the façade imports this module.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, overload

from oncebox.aio import AsyncBox
from oncebox.brokers.brokered import broker_kind, refuse_unbrokerable, relay_channel
from oncebox.jobs.codec import DEFAULT_MAX_PAYLOAD_BYTES
from oncebox.jobs.debounce import Debounce, Throttle
from oncebox.jobs.keyguard import KeyGuard
from oncebox.jobs.limits import TaskLimit
from oncebox.jobs.periods import PeriodKind
from oncebox.jobs.retry import Retry
from oncebox.jobs.tasks import (
    DEFAULT_QUEUE,
    DEFAULT_TIMEOUT,
    Registry,
    Task,
    check_name,
    make_task,
)
from oncebox.kernel.errors import ConfigurationError, NotFound
from oncebox.kernel.metrics import Metrics
from oncebox.lanes.assembly import (
    build_consumer,
    build_dispatcher,
    build_expiry_sweeper,
    build_ticker,
    worker_name,
)
from oncebox.lanes.consumer import Consumer, ConsumerConfig
from oncebox.lanes.dispatcher import DispatcherConfig, OutboxDispatcher
from oncebox.lanes.expiry_sweeper import ExpirySweeper, ExpirySweeperConfig
from oncebox.lanes.ticker import ScheduleTicker
from oncebox.lanes.worker import Worker, WorkerConfig, WorkerResult
from oncebox.outbox.channels import Channel, ChannelSet
from oncebox.outbox.tokens import SecretSource
from oncebox.providers import Provider
from oncebox.queue.claim_session import ClaimSessions
from oncebox.queue.transport import Transport
from oncebox.queue.watch import HandlerWatch
from oncebox.retention.policy import Retention
from oncebox.runtime import enqueue as enqueueing
from oncebox.runtime.enqueue import EnqueueManyResult, EnqueueResult
from oncebox.runtime.fanout import FanOutResult, TakenOver, run_schedule, take_over
from oncebox.runtime.operations import Operations
from oncebox.runtime.runtime import Runtime
from oncebox.runtime.trigger import TOLERANCE, Fired, ScheduleTrigger
from oncebox.schedules.schedule import CatchUp, Overlap, Schedule, ScheduleContext, make_schedule
from oncebox.schedules.slo import Slo
from oncebox.store import open_store
from oncebox.store.params import Audit, ScheduleRunRef, reason_text
from oncebox.store.protocol import Store
from oncebox.timers.sweeper import SweepContext, Sweeper, make_sweeper

__all__ = ["Box", "EnqueueManyResult", "EnqueueResult"]
F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_URL = "sqlite:///oncebox.db"
# logged when a Box falls back to DEFAULT_URL; the CLI says it in its own words (cli/common.py)
DEFAULT_NOTICE = "no database given (Box(url) or ONCEBOX_DB): using %s, a SQLite file in %s"
log = logging.getLogger("oncebox")
RESERVED_ARGS = frozenset({"connection", "run_at", "delay", "priority"})


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
        retention: Retention | None = None,
    ) -> None:
        url = url if url is not None else os.environ.get("ONCEBOX_DB")
        if store is None and not url:
            url = DEFAULT_URL  # the embedded default: zero set-up, and it says so
            log.warning(DEFAULT_NOTICE, url, os.getcwd())
        metrics = Metrics()
        if store is None:
            store = open_store(str(url), metrics=metrics)
        else:
            metrics = getattr(store, "metrics", metrics)
        where: str = getattr(store, "where", store.url)
        self.runtime = Runtime(
            store=store,
            where=where,
            registry=Registry(),
            channel_set=ChannelSet(),
            secrets=SecretSource(store, where, secret),
            metrics=metrics,
            rng=random.Random(seed),
            max_payload_bytes=max_payload_bytes,
            retention=retention or Retention(),
        )

    # the runtime's parts, as the box's users and tools have always reached them
    @property
    def where(self) -> str:
        return self.runtime.where

    @property
    def registry(self) -> Registry:
        return self.runtime.registry

    @property
    def rng(self) -> random.Random:
        return self.runtime.rng

    @property
    def key_guard(self) -> KeyGuard:
        return self.runtime.key_guard

    @property
    def max_payload_bytes(self) -> int:
        return self.runtime.max_payload_bytes

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
        keep_jobs: timedelta | None = None,
        limits: Sequence[TaskLimit] | None = None,
        partition: str | None = None,
        debounce: Debounce | None = None,
        throttle: Throttle | None = None,
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
        keep_jobs: timedelta | None = None,
        limits: Sequence[TaskLimit] | None = None,
        partition: str | None = None,
        debounce: Debounce | None = None,
        throttle: Throttle | None = None,
    ) -> Task | Callable[[F], Task]:
        """Declare a task. `key` is the business-key template (omit it for a plain at-least-once
        job); `group_by` names an argument whose value orders the task's queue (one job per
        group at a time, in enqueue order); `keep_intents` opts into pruning intents;
        `keep_jobs` keeps its finished jobs longer or shorter than the box's `Retention.jobs`
        (`timedelta.max`: for ever); `limits` caps how many of its jobs run at once and how fast
        they start, on every host together (`oncebox.Concurrency`, `oncebox.Rate`), per value of
        the `partition` template for those with `per_partition=True` (`jobs/limits.py`);
        `debounce` / `throttle` collapse enqueues within a window into one pending job
        (`jobs/debounce.py`)."""

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
                keep_jobs=keep_jobs,
                limits=limits,
                partition=partition,
                debounce=debounce,
                throttle=throttle,
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
        return enqueueing.enqueue(
            self.runtime,
            task,
            args,
            connection=connection if connection is not None else self.runtime.ambient_connection(),
            run_at=run_at,
            delay=delay,
            priority=priority,
        )

    def enqueue_many(
        self,
        task: Task | str | Callable[..., Any],
        args_list: Iterable[Mapping[str, Any]],
        *,
        connection: object | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        priority: int | None = None,
        schedule_run: ScheduleRunRef | None = None,
    ) -> EnqueueManyResult:
        """Enqueue many jobs of one task as one set, in one transaction — the caller's on
        `connection`: one bad job means nothing is written; jobs whose key is claimed or active
        are skipped (counted)."""
        return enqueueing.enqueue_many(
            self.runtime,
            task,
            args_list,
            connection=connection if connection is not None else self.runtime.ambient_connection(),
            run_at=run_at,
            delay=delay,
            priority=priority,
            schedule_run=schedule_run,
        )

    @property
    def aio(self) -> AsyncBox:
        """The awaitable surface for request code: `await box.aio.enqueue(...)`."""
        return AsyncBox(self.runtime, self)

    # -- handlers' ORM -------------------------------------------------------------------------

    def use_sqlalchemy(self, **session_options: Any) -> None:
        """Give handlers `ctx.session`: a SQLAlchemy Session on the claim's connection, made
        with these Session options (`autoflush`, `info`, `expire_on_commit`, ...). Call once,
        before workers start; needs the `oncebox[sqlalchemy]` extra."""
        self.runtime.orm = ClaimSessions(self.store.dialect, session_options)

    # -- broker-backed queues ------------------------------------------------------------------

    def queue(self, name: str, *, broker: str) -> None:
        """Declare that the broker at `broker` (``amqp://HOST:5672/VHOST``: RabbitMQ) holds queue
        `name`: workers serving it consume from the broker (`brokers/rabbitmq/transport.py`),
        claiming each job's key as for any job. On PostgreSQL an enqueue writes the job `relayed`,
        in the caller's transaction when given one, and the relay — the outbox channel
        `~broker.<name>` — publishes it, so `jobs`, `status`, `dlq` and `cancel` read it as any job
        (`brokers/brokered.py` says what such a queue refuses). `publish_unrecorded` publishes
        without a record (SQLite's only way)."""
        check_name("queue", name)
        try:
            broker_kind(broker)
        except ConfigurationError as exc:
            raise ConfigurationError(f"queue {name!r}: {exc}") from None
        known = self.runtime.brokers.get(name)
        if known is not None and known != broker:
            raise ConfigurationError(f"queue {name!r} is declared with two brokers")
        self.runtime.brokers[name] = broker
        self.runtime.channel_set.add(relay_channel(name, broker, self.runtime.wire_for))

    def publish_unrecorded(self, task: Task | str | Callable[..., Any], /, **args: Any) -> str:
        """Publish a job of `task` straight to its queue's broker, confirmed, with no record in
        the store (no outbox: a crash before the confirm loses it, a lost confirm raises). The
        arguments are checked as an enqueue checks them; a task ordered by `group_by` is refused
        (only the relay keeps a group's order). Returns the message id."""
        resolved = self.registry.resolve(task)
        broker = self.runtime.brokers.get(resolved.queue)
        if broker is None:
            raise ConfigurationError(
                f"task {resolved.name!r}: its queue {resolved.queue!r} has no broker "
                "(box.queue(name, broker=...)); enqueue it instead"
            )
        refuse_unbrokerable(resolved, recorded=False)
        from oncebox.brokers.transport import task_message  # noqa: PLC0415

        message = task_message(resolved, args, self.runtime.max_payload_bytes)
        queue = self.runtime.wire_for(broker, resolved.queue)
        most = getattr(queue, "max_deliveries", None)  # SQS, NATS: the attempt is the count
        if most is not None and resolved.retry.max_attempts > most:
            raise ConfigurationError(
                f"task {resolved.name!r} makes up to {resolved.retry.max_attempts} attempts, and "
                f"its broker gives a message up after {most} deliveries: raise max_deliveries "
                "in the broker's URL to at least the task's attempts"
            )
        try:
            queue.declare()
            queue.publish([message])
        finally:
            queue.close()
        return message.message_id

    # -- the outbox ----------------------------------------------------------------------------

    def channel(
        self,
        name: str = "email",
        provider: Provider | str | None = None,
        **policies: Any,
    ) -> Channel:
        """Declare a channel (see `oncebox.outbox.channels`). Without a provider,
        `ONCEBOX_EMAIL` or the embedded default (`file://oncebox-outbox`) is used."""
        return self.runtime.channel_set.declare(name, provider, **policies)

    @property
    def channels(self) -> dict[str, Channel]:
        """The declared channels; an `email` channel exists unless declared otherwise."""
        return self.runtime.channels

    def secret(self) -> str:
        """The HMAC secret outbox tokens are derived with: `Box(secret=...)`, else
        `ONCEBOX_SECRET`, else one stored in the database (`init_secret`)."""
        return self.runtime.secrets.get()

    def ensure_secret(self) -> str:
        """The secret; when none is configured anywhere, a random one stored in the database —
        which every process without `ONCEBOX_SECRET` then shares."""
        return self.runtime.secrets.ensure()

    def init_secret(self) -> str:
        """Store a random secret in the database unless one is there (every worker then agrees);
        an explicit or environment secret still wins."""
        return self.runtime.secrets.init()

    def dispatcher(
        self, config: DispatcherConfig | None = None, *, name: str = "d0"
    ) -> OutboxDispatcher:
        """A dispatcher lane for `run_once()` in tests and tools."""
        return build_dispatcher(
            self.runtime, config or DispatcherConfig(), self.channels, name=name, rng=self.rng
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
        slo: Slo | None = None,
    ) -> Callable[[Callable[[ScheduleContext], Iterable[Mapping[str, Any]]]], Schedule]:
        """Declare a schedule over the decorated eligible-set callable (see
        `oncebox.schedules.schedule`), which yields one task-args mapping per eligible subject,
        for `ctx.period`."""

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
                slo=slo,
            )
            if name in self.runtime.schedules:
                raise ConfigurationError(f"two schedules are named {name!r}")
            known = declared.task in self.registry
            collapse = self.registry.get(declared.task).collapse if known else None
            if collapse is not None:
                raise ConfigurationError(
                    f"schedule {name!r}: task {declared.task!r} is {collapse.mode}d, and "
                    "a fan-out enqueues its jobs as one set; schedule a task without one"
                )
            self.runtime.schedules[name] = declared
            return declared

        return register

    @property
    def schedules(self) -> dict[str, Schedule]:
        return dict(self.runtime.schedules)

    def _schedule(self, name: str) -> Schedule:
        try:
            return self.runtime.schedules[name]
        except KeyError:
            known = ", ".join(sorted(self.runtime.schedules)) or "none"
            raise NotFound(f"no schedule named {name!r} (declared: {known})") from None

    def run_schedule(self, name: str, period: str) -> FanOutResult:
        """Fan out one period again: enqueues only keys with no intent and no active job."""
        schedule = self._schedule(name)
        self.key_guard.require_schedule(schedule)
        self.key_guard.require_task(self.registry.resolve(schedule.task))
        schedule.period.check(period)  # before anything is written
        self.store.schedule_state(schedule.name, schedule.grace)  # known to status from now on
        return run_schedule(self.runtime, schedule, period, worker_name("manual"))

    def take_over_schedule_run(
        self, name: str, period: str, *, reason: str, actor: str = "api"
    ) -> TakenOver:
        """Take the period's running fan-out from an owner that is gone (it stopped renewing)
        and fan it out now, without waiting out its lease; audited. Refused for a live owner,
        and when the run changed after it was read (`runtime/fanout.py`)."""
        schedule = self._schedule(name)
        self.key_guard.require_schedule(schedule)
        self.key_guard.require_task(self.registry.resolve(schedule.task))
        return take_over(
            self.runtime,
            schedule,
            period,
            worker_name("manual"),
            actor=actor,
            reason=reason_text(reason),
        )

    def fire_schedule(self, name: str, *, tolerance: timedelta = TOLERANCE) -> Fired:
        """Fire `name` as an external cron's trigger would: the period of its latest fire at or
        before the store's clock (or due within `tolerance`), fanned out once however often it
        is fired (`runtime/trigger.py`)."""
        schedule = self._schedule(name)
        return ScheduleTrigger(self.runtime, worker_name("trigger"), tolerance).fire(schedule)

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
        return build_ticker(self.runtime)

    def sweeper(
        self,
        name: str,
        *,
        every: timedelta = timedelta(seconds=30),
        batch_size: int = 100,
        timeout: timedelta = timedelta(seconds=60),
    ) -> Callable[[Callable[[SweepContext], int]], Sweeper]:
        """Declare a due-row sweeper (see `oncebox.timers.sweeper`)."""

        def register(handler: Callable[[SweepContext], int]) -> Sweeper:
            declared = make_sweeper(
                name, handler, every=every, batch_size=batch_size, timeout=timeout
            )
            if name in self.runtime.sweepers:
                raise ConfigurationError(f"two sweepers are named {name!r}")
            self.runtime.sweepers[name] = declared
            return declared

        return register

    @property
    def sweepers(self) -> dict[str, Sweeper]:
        return dict(self.runtime.sweepers)

    def expiry_sweeper(
        self, name: str, lock_timeout: timedelta = timedelta(seconds=2)
    ) -> ExpirySweeper:
        """One sweeper's lane, for `run_once()` in tests and tools; `close()` it after."""
        try:
            return build_expiry_sweeper(
                self.runtime, self.runtime.sweepers[name], ExpirySweeperConfig(lock_timeout)
            )
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
        return self.worker(config).run()

    def worker(self, config: WorkerConfig | None = None) -> Worker:
        """A worker not yet running: `run()` it (in a thread, for tests that `stop()` it)."""
        return Worker(self.runtime, config)

    def consumer(
        self,
        config: ConsumerConfig | None = None,
        *,
        transport: Transport | None = None,
        watch: HandlerWatch | None = None,
        name: str = "c0",
    ) -> Consumer:
        """A single consumer lane (table queue unless `transport` is given), for `run_once()` in
        tests and tools. Close it with `consumer.close()` (it gives back first what a store
        outage left it, if the store answers)."""
        consumer, _transport = build_consumer(
            self.runtime,
            config or ConsumerConfig(),
            watch or HandlerWatch(exit_on_hang=False),
            name=name,
            transport=transport,
        )
        return consumer

    def close(self) -> None:
        self.runtime.channel_set.close()
        self.store.close()

    def __enter__(self) -> Box:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
