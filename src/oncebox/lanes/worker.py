"""The worker process: consumer and dispatcher threads, plus the lanes that keep leases honest.

Lanes, each in its own thread (each module named lives with the concept it serves):
- consumers (`concurrency` of them): lease a batch, run consumer transactions
  (`lanes/consumer.py`); idle, they wait for a wake-up — from the listener, an enqueue in this
  process, the next due job, or the poll interval, whichever comes first;
- a dispatcher (when the box has channels): delivers outbox rows (`lanes/dispatcher.py`); woken
  by consumers of this process that wrote outbox rows, by the listener, or the poll interval;
- the resolver (when a channel's provider can look messages up): settles ambiguous sends
  (`lanes/resolver.py`);
- the scheduler (when the box has schedules): fans out due periods (`lanes/ticker.py`);
- a sweeper per declared sweeper: due-row transitions with their notices
  (`lanes/expiry_sweeper.py`);
- the lease keeper: heartbeats held leases; the watchdog for hung handlers
  (`lanes/lease_keeper.py`);
- the lease rescuer: expired job and outbox leases (`lanes/lease_rescuer.py`,
  `lanes/delivery_rescuer.py`);
- the pruner: finished-job retention and explicit intent policies (`lanes/pruner.py`);
- the listener: wakes the lanes when work may have arrived — a NOTIFY on PostgreSQL, a commit
  seen in the database files on SQLite (`SqliteStore.wait_for_work`); the poll interval is only
  the fallback.

Shutdown is graceful: SIGTERM or SIGINT stops claiming, lets the running transaction finish and
gives back leased jobs it has not started, without spending their attempt. A second signal exits
at once (the leases then expire and are rescued).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import random
import signal
import socket
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING

from oncebox.brokers.brokered import RELAY_PREFIX
from oncebox.kernel import clock, points
from oncebox.kernel.errors import (
    BrokerUnavailable,
    ClockHeld,
    ConfigurationError,
    OnceboxError,
    SchemaError,
    StoreReplaced,
    StoreUnavailable,
)
from oncebox.lanes.assembly import (
    broker_transport,
    build_consumer,
    build_dispatcher,
    build_expiry_sweeper,
    build_given_up_sweep,
    build_lease_keeper,
    build_lease_rescuer,
    build_pruner,
    build_resolver,
    build_ticker,
    worker_name,
)
from oncebox.lanes.consumer import Consumer, ConsumerConfig, ConsumerResult
from oncebox.lanes.dispatcher import DispatcherConfig, DispatcherResult, OutboxDispatcher
from oncebox.lanes.expiry_sweeper import ExpirySweeper, ExpirySweeperConfig
from oncebox.lanes.lease_keeper import LeaseKeeperConfig
from oncebox.lanes.lease_rescuer import LeaseRescuerConfig
from oncebox.lanes.pruner import PrunerConfig
from oncebox.outbox.channels import Channel
from oncebox.queue.transport import Transport
from oncebox.queue.watch import HandlerWatch
from oncebox.runtime.runtime import Runtime
from oncebox.store.migrations import check_runnable
from oncebox.store.params import EVERY_KIND, JOBS, OUTBOX, WorkerBeat, WorkKind
from oncebox.store.protocol import Store
from oncebox.store.records import BacklogRow

if TYPE_CHECKING:
    from oncebox.lanes.given_up import GivenUpSweep

log = logging.getLogger("oncebox.worker")


def unserved(store: Store) -> list[tuple[str, int]]:
    """Tasks with jobs waiting that no live worker serves, with how many wait."""
    served = {task for w in store.worker_list(LIVE_WITHIN) if w.live for task in w.tasks}
    return [
        (row.name, row.waiting)
        for row in store.backlog_list()
        if row.kind == "job" and row.waiting and row.name not in served
    ]


GUARD_EVERY = 5.0  # seconds between two looks at the database file
CLOCK_EVERY_GUARDS = 3  # ... and at the clock setting, every third of those (15 s)
PRESENCE_EVERY = 10.0  # seconds between two refreshes of this worker's row in oncebox_workers
LIVE_WITHIN = timedelta(seconds=3 * PRESENCE_EVERY)  # a worker seen this recently is live
MISSED_DUE_WAIT = 0.05  # seconds before a lane looks again at work due that it did not lease
UNSERVED_EVERY = 300.0  # seconds between two looks for jobs no live worker serves
_instances = itertools.count(1)


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker runs. `poll_interval` (default 5 s) is the fallback: the listener wakes idle
    lanes sooner, on a NOTIFY (PostgreSQL) or a commit seen in the database files (SQLite)."""

    concurrency: int = 1
    queues: tuple[str, ...] | None = None
    until_idle: bool = False
    poll_interval: timedelta | None = None
    handler_grace: timedelta = timedelta(seconds=10)
    exit_on_hung_handler: bool = True
    consume: bool = True
    dispatch: bool = True
    schedule: bool = True
    sweep: bool = True
    simulated_time: bool = False  # the caller drives the database's clock on purpose (the demo)
    # until_idle: keep working while this worker's own work falls due within this much of the
    # database's time (a retry's backoff, a channel's pause, a stranded lease running out)
    idle_horizon: timedelta = timedelta(seconds=60)
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    dispatcher: DispatcherConfig = field(default_factory=DispatcherConfig)
    rescuer: LeaseRescuerConfig = field(default_factory=LeaseRescuerConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 256:
            raise ConfigurationError("concurrency must be within 1..256")
        if self.poll_interval is not None and self.poll_interval <= timedelta(0):
            raise ConfigurationError("poll_interval must be positive")
        if not timedelta(0) <= self.idle_horizon <= timedelta(days=1):
            raise ConfigurationError("idle_horizon must be within 0 s .. 1 day")


@dataclass
class WorkerResult:
    """What a worker did; for an `until_idle` run, also what it left (`remaining`: every task
    and channel with work not finished, `unserved`: the tasks among them no live worker serves,
    `now`: the database's time when it stopped)."""

    consumed: ConsumerResult = field(default_factory=ConsumerResult)
    dispatched: DispatcherResult = field(default_factory=DispatcherResult)
    remaining: list[BacklogRow] = field(default_factory=list)
    unserved: list[str] = field(default_factory=list)
    now: datetime | None = None

    @property
    def settled(self) -> bool:
        """Nothing remains: every job and message reached a final or held state."""
        return not self.remaining

    def __str__(self) -> str:
        """For people: what the worker did, and (after `until_idle`) what it left."""
        consumed, dispatched = self.consumed, self.dispatched
        text = (
            f"worker stopped: {consumed.completed} completed, {consumed.duplicates} "
            f"duplicate(s) absorbed, {consumed.retried} retried, {consumed.dead} dead; "
            f"{dispatched.sent} message(s) sent, {dispatched.ambiguous} held (ambiguous)"
        )
        for row in self.remaining:
            what = "job(s) of task" if row.kind == "job" else "message(s) on channel"
            text += f"\n  still waiting: {row.waiting + row.held} {what} {row.name}"
            if row.kind == "job" and row.name in self.unserved:
                text += " (no live worker serves this task)"
        return text


@dataclass(frozen=True)
class WorkerStarted:
    """What a worker runs, told once its checks have passed and before its lanes start
    (`Worker.run(on_start=…)`): `oncebox worker` prints it as its first line. `where` is the
    store without its password; `channels` are those it delivers (a broker queue's relay
    channel is not one of yours, and is left out)."""

    where: str
    tasks: tuple[str, ...]
    channels: tuple[str, ...]
    concurrency: int
    scheduler: bool


class Worker:
    def __init__(self, runtime: Runtime, config: WorkerConfig | None = None) -> None:
        self.runtime = runtime
        self.config = config or WorkerConfig()
        self.stop_event = threading.Event()
        self._wakes: list[threading.Event] = []
        self._kinds: list[WorkKind] = []  # the kind of work each polling lane does
        self._idle: set[int] = set()
        # wake-ups of each lane so far: a round that began before its latest proves nothing
        self._woken: list[int] = []
        self._pollers = 0
        self._idle_lock = threading.Lock()
        self._result = WorkerResult()
        self._result_lock = threading.Lock()
        self._signals = 0
        self._error: Exception | None = None
        self.watch = HandlerWatch(self.config.handler_grace, self.config.exit_on_hung_handler)
        self.name = worker_name(f"w{next(_instances)}")  # its row in oncebox_workers
        self._given_up: GivenUpSweep | None = None  # its broker-held queues' (`_background_lanes`)

    def _close(
        self, consumers: list[tuple[Consumer, Transport]], sweepers: list[ExpirySweeper]
    ) -> None:
        """What the lanes held open: sessions (a consumer gives back what a store outage left
        it first, if the store answers), broker connections."""
        for consumer, transport in consumers:
            consumer.close()
            closer = getattr(transport, "close", None)
            if callable(closer):
                closer()  # a broker's connection
        for sweeper in sweepers:
            sweeper.close()
        if self._given_up is not None:
            self._given_up.close()

    @property
    def poll_interval(self) -> float:
        if self.config.poll_interval is not None:
            return self.config.poll_interval.total_seconds()
        return (
            5.0 if self.runtime.store.supports_notifications else 1.0
        )  # a store without a listener

    def wake(self, kinds: Collection[WorkKind] = EVERY_KIND) -> None:
        """New work of `kinds` may exist (an enqueue or an outbox row in this process, a
        NOTIFY): the polling lanes of those kinds look again — and none of them counts as idle
        until it has (so `until_idle` cannot stop between a consumer writing outbox rows and the
        dispatcher seeing them). Lanes of other kinds sleep on: a job's NOTIFY sent through an
        idle dispatcher's lease round used to triple the pick-up latency at 200 jobs/s."""
        with self._idle_lock:
            woken = [i for i, kind in enumerate(self._kinds) if kind in kinds]
            for index in woken:
                self._idle.discard(index)
                self._woken[index] += 1
        for index in woken:
            self._wakes[index].set()
        points.reach("worker.woken")

    def stop(self) -> None:
        self.stop_event.set()
        self.wake()

    def _preflight(self) -> None:
        """Refuse to start on what would fail every job, or stall it."""
        check_runnable(self.runtime.store.schema_status(), self.runtime.where)
        self.runtime.secrets.ensure()  # without one, every message would fail its job
        self._check_clock()

    def _check_clock(self) -> None:
        if not self.config.simulated_time:
            refuse_foreign_clock(self.runtime)

    def run(self, on_start: Callable[[WorkerStarted], None] | None = None) -> WorkerResult:
        """Run until stopped (or idle, with `until_idle`); `on_start` hears what it runs once
        its checks have passed, before any lane starts."""
        self._preflight()
        # before any lane: this code's limits hold their jobs against another release's rescuer
        self.runtime.limit_declarations.declare_all()
        consumers = self._consumers()
        channels = self.runtime.channels if self.config.dispatch else {}
        sweepers = [
            build_expiry_sweeper(
                self.runtime, sweeper, ExpirySweeperConfig(self.config.consumer.lock_timeout)
            )
            for sweeper in (self.runtime.sweepers.values() if self.config.sweep else ())
        ]
        ticker = (
            build_ticker(self.runtime) if self.config.schedule and self.runtime.schedules else None
        )
        if on_start is not None:
            on_start(
                WorkerStarted(
                    where=self.runtime.where,
                    tasks=self._beat().tasks,
                    channels=tuple(c for c in sorted(channels) if not c.startswith(RELAY_PREFIX)),
                    concurrency=self.config.concurrency,
                    scheduler=ticker is not None,
                )
            )
        if self.config.until_idle:  # what is due now is part of "until idle"
            if ticker is not None:
                ticker.run_once()
            for sweeper in sweepers:
                sweeper.run_once()
        pollers = self._polling_lanes([c for c, _t in consumers], channels)
        threads = self._background_lanes(consumers, channels)
        threads += [
            threading.Thread(
                target=self._stops_on_fatal(lane.run_forever),
                args=(self.stop_event,),
                name=f"oncebox-{name}",
                daemon=True,
            )
            for name, lane in [
                ("scheduler", ticker),
                *((f"sweeper-{s.sweeper.name}", s) for s in sweepers),
            ]
            if lane is not None
        ]
        restore = self._install_signal_handlers()
        with contextlib.suppress(StoreUnavailable):  # announced before any lane can look
            self.runtime.store.worker_beat(self._beat())  # (`_done`'s unserved tasks)
        self.runtime.workers.attach(self)
        try:
            for thread in threads + pollers:
                thread.start()
            for thread in pollers:
                while thread.is_alive():
                    thread.join(0.5)
        finally:
            self.stop()
            self.runtime.workers.detach(self)
            for thread in threads:
                thread.join(5)
            self._close(consumers, sweepers)
            restore()
        if self._error is not None:
            raise self._error
        return self._result

    def _served(self) -> tuple[str, ...]:
        return self.config.queues or tuple(
            sorted({task.queue for task in self.runtime.registry.all()})
        )

    def _brokered(self) -> dict[str, list[str]]:
        """The broker-held queues this worker consumes, with their tasks."""
        if not self.config.consume:
            return {}
        tasks = self.runtime.registry.all()
        return {
            queue: [task.name for task in tasks if task.queue == queue]
            for queue in self._served()
            if queue in self.runtime.brokers
        }

    def _consumers(self) -> list[tuple[Consumer, Transport]]:
        """`concurrency` lanes on the table queue for the queues the store holds, and as many
        per queue a broker holds (`box.queue(name, broker=...)`), each on its own connection."""
        if not self.config.consume:
            return []
        served = self._served()
        brokered = [queue for queue in served if queue in self.runtime.brokers]
        tabled = tuple(queue for queue in served if queue not in self.runtime.brokers)
        lanes = range(self.config.concurrency)
        consumers = [
            build_consumer(
                self.runtime,
                self.config.consumer,
                self.watch,
                queues=tabled,
                name=f"c{i}",
                rng=random.Random(self.runtime.rng.random()),
            )
            for i in (lanes if tabled else ())
        ]
        for queue in brokered:
            for i in lanes:
                name = f"{queue}-c{i}"
                transport = broker_transport(self.runtime, queue, self.config.consumer, name)
                consumers.append(
                    build_consumer(
                        self.runtime,
                        self.config.consumer,
                        self.watch,
                        name=name,
                        rng=random.Random(self.runtime.rng.random()),
                        transport=transport,
                    )
                )
        return consumers

    def _polling_lanes(
        self, consumers: list[Consumer], channels: dict[str, Channel]
    ) -> list[threading.Thread]:
        pollers: list[threading.Thread] = []
        for consumer in consumers:
            consumer.stopping = self.stop_event.is_set
            consumer.outbox_written = lambda _count: self.wake(OUTBOX)
            pollers.append(
                self._poller(
                    "jobs",
                    f"consumer-{len(pollers)}",
                    self._consumer_round(consumer),
                    functools.partial(self._idle_wait, consumer.transport.next_due_in),
                    consumer.transport.next_due_in if consumer.transport.can_probe() else None,
                    long_poll=getattr(consumer.transport, "long_polls", False),
                )
            )
        if channels:
            dispatcher = build_dispatcher(
                self.runtime,
                self.config.dispatcher,
                channels,
                name="d0",
                rng=random.Random(self.runtime.rng.random()),
            )
            pollers.append(
                self._poller(
                    "outbox",
                    "dispatcher",
                    self._dispatcher_round(dispatcher),
                    functools.partial(self._idle_wait, dispatcher.next_due_in),
                    dispatcher.next_due_in,
                )
            )
        if not pollers:
            raise ConfigurationError("this worker has no lane to run: enable consume or dispatch")
        return pollers

    def _background_lanes(
        self, consumers: list[tuple[Consumer, Transport]], channels: dict[str, Channel]
    ) -> list[threading.Thread]:
        def tokens() -> list[str]:
            return [token for _c, transport in consumers for token in transport.held_tokens()]

        store = self.runtime.store

        def keep_alive(hold_for: timedelta) -> None:
            for _c, transport in consumers:
                holder = getattr(transport, "keep_alive", None)
                if holder is not None:
                    holder(hold_for)

        keeper = build_lease_keeper(
            self.runtime,
            LeaseKeeperConfig(self.config.consumer.lease),
            self.watch,
            tokens,
            keep_alive,
        )
        brokered = self._brokered()
        rescuer = build_lease_rescuer(
            self.runtime,
            self.config.rescuer,
            channels,
            brokered=brokered if store.dialect == "postgres" else None,
        )
        pruner = build_pruner(self.runtime, self.config.pruner)
        resolver = build_resolver(self.runtime, channels)
        rescuer.run_once()
        lanes: list[tuple[str, Callable[[threading.Event], None]]] = [
            ("lease-keeper", keeper.run_forever),
            ("rescuer", rescuer.run_forever),
            ("pruner", pruner.run_forever),
        ]
        if brokered:  # what their brokers gave up on: a lane of its own (a broker may be slow)
            served = {queue: self.runtime.brokers[queue] for queue in brokered}
            self._given_up = build_given_up_sweep(self.runtime, served, worker=self.name)
            self._given_up.run_once()  # an until-idle run included
            lanes.append(("given-up", self._given_up.run_forever))
        if resolver.active:
            lanes.append(("resolver", resolver.run_forever))
        lanes.append(("presence", self._presence))
        lanes.append(("guard", self._guard))
        if store.supports_notifications and not self.config.until_idle:
            # an until-idle run looks for work itself and exits when there is none: a listener
            # would only make its exit wait out a LISTEN timeout
            lanes.append(("listener", lambda _stop: self._listen()))
        return [
            threading.Thread(
                target=self._stops_on_fatal(run),
                args=(self.stop_event,),
                name=f"oncebox-{name}",
                daemon=True,
            )
            for name, run in lanes
        ]

    def _stops_on_fatal(
        self, run: Callable[[threading.Event], None]
    ) -> Callable[[threading.Event], None]:
        """A background lane that meets a damaged or vanished database stops the worker, as a
        polling lane does (`_poll`), in one line and without a traceback: a lane whose first
        connection comes after a deletion finds it before the guard's next look."""

        def stopping(stop: threading.Event) -> None:
            try:
                run(stop)
            except (SchemaError, StoreReplaced) as fatal:
                self._fail(fatal)

        return stopping

    # -- polling lanes (consumers, dispatchers) ------------------------------------------------

    def _consumer_round(self, consumer: Consumer) -> Callable[[], int]:
        relayed = getattr(consumer.transport, "long_polls", False)  # a broker's lane

        def round_() -> int:
            result = consumer.run_once()
            with self._result_lock:
                self._result.consumed.add(result)
            if relayed and result.leased:
                # a relayed job's retry, or a group's next job once its head ended, is a publish
                # written in the same commit (0016): the dispatcher looks again, as for a
                # handler's outbox rows
                self.wake(OUTBOX)
            return result.leased

        return round_

    def _dispatcher_round(self, dispatcher: OutboxDispatcher) -> Callable[[], int]:
        relays = any(name.startswith(RELAY_PREFIX) for name in dispatcher.channels)

        def round_() -> int:
            result = dispatcher.run_once()
            with self._result_lock:
                self._result.dispatched.add(result)
            if relays and result.sent:
                # a broker-held queue's jobs were published: its consumer lanes look again (a
                # broker cannot wake them), and none counts as idle until it has
                self.wake(JOBS)
            return result.leased

        return round_

    def _poller(
        self,
        kind: WorkKind,
        name: str,
        round_: Callable[[], int],
        idle_wait: Callable[[int], float],
        probe: Callable[[], float | None] | None = None,
        *,
        long_poll: bool = False,
    ) -> threading.Thread:
        index = self._pollers
        self._pollers += 1
        wake = threading.Event()
        with self._idle_lock:
            self._wakes.append(wake)
            self._kinds.append(kind)
            self._woken.append(0)
        return threading.Thread(
            target=self._poll,
            args=(index, name, round_, idle_wait, wake),
            kwargs={"probe": probe, "long_poll": long_poll},
            name=f"oncebox-{name}",
        )

    def _poll(
        self,
        index: int,
        name: str,
        round_: Callable[[], int],
        idle_wait: Callable[[int], float],
        wake: threading.Event,
        *,
        probe: Callable[[], float | None] | None = None,
        long_poll: bool = False,
    ) -> None:
        """Run rounds while they find work; when one finds none, wait — for a wake-up (a
        NOTIFY, a commit seen in the files, this process's own enqueue), the next due time, or
        the poll interval. A wait that ran out without a wake-up asks `probe` first (a fresh
        look at what is due: one statement) and only then runs a round (a lease's transaction),
        so an idle lane's fallback poll costs the server one statement.

        A `long_poll` lane (a broker's: each round itself waits for messages) stays idle from a
        round that found nothing through the rounds after it until one leases: its rounds run
        back to back, and an `until_idle` run must still see every lane idle at once."""
        backoff = 0.0
        misses = 0  # idle rounds in a row that found work due but leased none
        idle = False  # (long_poll) the last round found nothing
        while not self.stop_event.is_set():
            wake.clear()
            # busy until a round of its own finds nothing
            began = self._wakeups(index) if long_poll and idle else self._busy(index)
            try:
                leased = round_()
                backoff = 0.0
            except (StoreUnavailable, BrokerUnavailable) as exc:
                backoff = min(max(backoff * 2, 0.5), 30.0)
                log.warning("%s: %s; retrying in %.1fs", name, exc, backoff)
                self.stop_event.wait(backoff)
                continue
            except (SchemaError, StoreReplaced) as fatal:  # a damaged or vanished database
                self._fail(fatal)
                return
            except Exception as exc:
                if self.config.until_idle:  # a run meant to finish fails loudly, and ends
                    self._error = self._error or exc
                    self.stop()
                    return
                backoff = min(max(backoff * 2, 0.5), 30.0)
                log.exception("%s failed a round; retrying in %.1fs", name, backoff)
                self.stop_event.wait(backoff)
                continue
            if leased:
                misses = 0
                if long_poll and idle:
                    idle = False
                    self._busy(index)
                continue
            idle = True
            if self.config.until_idle and self._all_idle(index, began) and self._done():
                self.stop()
                return
            try:
                wait = idle_wait(misses)
                misses = misses + 1 if wait < 0 else 0
                # an until-idle run decides to end after a round (`_done`): it never probes, or
                # work it waited for that another worker finished would keep it waiting for ever
                probing = probe if not self.config.until_idle else None
                while not wake.wait(abs(wait)) and wait > 0 and probing is not None:
                    wait = self._probe_wait(probing)
                    if wait <= 0 or self.stop_event.is_set():
                        break  # due now: lease it
            except (SchemaError, StoreReplaced) as fatal:  # as a round's (above)
                self._fail(fatal)
                return

    def _probe_wait(self, probe: Callable[[], float | None]) -> float:
        """How long an idle lane may go on waiting after its wait ran out: until the next due
        time the probe reads, at most a poll interval; 0 when something is due now, or when the
        store cannot answer (the round then says so, and backs off). A damaged or vanished
        database stops the worker (`_poll`)."""
        try:
            until = probe()
        except (SchemaError, StoreReplaced):
            raise
        except Exception:  # the round meets it again, logs it and backs off
            return 0.0
        if until is None:
            return self.poll_interval
        return max(0.0, min(self.poll_interval, until))

    def _done(self) -> bool:
        """Every lane is idle: may an `until_idle` run stop? Yes when nothing remains; when what
        remains of this worker's own work falls due beyond `idle_horizon`; or at once on a
        simulated clock (no time passes while it waits). What remains is kept for the result."""
        store = self.runtime.store
        try:
            remaining, now = store.backlog_list(), store.clock_now()
            serves = self._beat()
        except StoreUnavailable:
            return False
        ours = [
            row.next_at()
            for row in remaining
            if row.name in (serves.tasks if row.kind == "job" else serves.channels)
        ]
        soonest = min((at for at in ours if at is not None), default=None)
        waits = (
            soonest is not None
            and soonest <= now + self.config.idle_horizon
            and store.clock_get().is_real
        )
        if waits:
            return False
        with self._result_lock:
            self._result.remaining, self._result.now = remaining, now
            if remaining:
                self._result.unserved = [name for name, _ in unserved(store)]
        return True

    def _wakeups(self, index: int) -> int:
        """A lane's wake-ups so far (`_all_idle`), leaving it as idle as it was."""
        with self._idle_lock:
            return self._woken[index]

    def _busy(self, index: int) -> int:
        """Mark a polling lane busy; returns its wake-ups so far, for `_all_idle`."""
        with self._idle_lock:
            self._idle.discard(index)
            return self._woken[index]

    def _all_idle(self, index: int, began: int) -> bool:
        """Mark a lane idle after a round that found nothing; True when every lane is. A round
        that began before the lane's latest wake-up may have looked before the new work
        committed (a consumer's outbox rows, say): the lane is not idle until a round after it
        finds nothing."""
        with self._idle_lock:
            if self._woken[index] != began:
                return False
            self._idle.add(index)
            return len(self._idle) == self._pollers

    def _idle_wait(self, due_in: Callable[[], float | None], misses: int) -> float:
        """How long an idle lane waits: until its next job or message falls due (a delayed job,
        a retry's backoff, a rate limit's give-back), at most the poll interval.

        Work due already that the round did not lease is a race (it fell due between the lease
        and this look: a rate limit's give-back of a tenth of a second) or a wait on someone
        else (a group's head busy, a row another dispatcher holds). Neither is worth spinning
        for, and the first must not wait a whole poll: the lane looks again after 50 ms,
        doubling with each such round in a row up to the poll interval. That wait is returned
        negative, so the caller counts the miss."""
        wait = self.poll_interval
        try:
            until = due_in()
        except (SchemaError, StoreReplaced):
            raise  # the worker stops on it (`_poll`)
        except Exception:  # a poll later, the round meets it again, and logs it
            return wait
        if until is None:
            return wait
        if until > 0:
            return min(wait, until)
        return -min(wait, MISSED_DUE_WAIT * 2.0 ** min(misses, 16))

    def _beat(self) -> WorkerBeat:
        """What this worker serves: the tasks its consumers lease, the channels it delivers. A
        task whose keys drifted is not served — its consumers refuse it until `oncebox keys
        accept` — so its jobs are named as unserved, not waited for (`_done`)."""
        queues = self.config.queues
        tasks = self.runtime.key_guard.allowed(
            task.name
            for task in self.runtime.registry.all()
            if self.config.consume and (queues is None or task.queue in queues)
        )
        return WorkerBeat(
            name=self.name,
            host=socket.gethostname(),
            pid=os.getpid(),
            tasks=tuple(sorted(tasks)),
            queues=tuple(sorted(queues or {task.queue for task in self.runtime.registry.all()})),
            channels=tuple(sorted(self.runtime.channels)) if self.config.dispatch else (),
        )

    def _presence(self, stop: threading.Event) -> None:
        """Keep this worker's row in `oncebox_workers` fresh, so `status` knows which tasks live
        workers serve, and its code's limits declared (`jobs/declarations.py`); now and then,
        log the jobs that no live worker serves (a task removed in a deploy): they would
        otherwise wait in silence."""
        store, beat = self.runtime.store, self._beat()
        next_look = 0.0
        while True:
            with contextlib.suppress(StoreUnavailable):
                store.worker_beat(beat)
                self.runtime.limit_declarations.declare_all()
                if clock.monotonic() >= next_look:
                    next_look = clock.monotonic() + UNSERVED_EVERY
                    for name, waiting in unserved(store):
                        log.warning(
                            "%d job(s) of task %r wait and no live worker serves that task "
                            "(removed in a deploy? run a worker that registers it, or cancel "
                            "them: oncebox jobs list --task %s)",
                            waiting,
                            name,
                            name,
                        )
            if stop.wait(PRESENCE_EVERY):
                break
        with contextlib.suppress(Exception):
            store.worker_stop(beat.name)

    def _guard(self, stop: threading.Event) -> None:
        """Stop this worker, as it would have refused to start, when a test clock set by
        another process is in force (see `_check_clock`) or its SQLite file was replaced or
        deleted under it (`Store.check_identity`). The file is looked at every pass (a `stat`,
        no query); the clock setting, a query, every `CLOCK_EVERY_GUARDS` passes, so an idle
        worker's own reads stay under one statement a second."""
        for guard in itertools.count(1):
            if stop.wait(GUARD_EVERY):
                return
            try:
                self.runtime.store.check_identity()
                if guard % CLOCK_EVERY_GUARDS == 0:
                    self._check_clock()
            except StoreUnavailable:
                continue
            except (ClockHeld, StoreReplaced) as fatal:
                self._fail(fatal)
                return

    def _fail(self, error: OnceboxError) -> None:
        """A condition no retry can mend: say it once, stop, and make `run` raise it."""
        log.error("%s", error)
        self._error = self._error or error
        self.stop()

    def _listen(self) -> None:
        while not self.stop_event.is_set():
            try:
                kinds = self.runtime.store.wait_for_work(timeout=1.0)
                if kinds:
                    self.wake(kinds)
            except StoreUnavailable:
                self.stop_event.wait(1.0)

    # -- signals -------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handle(signum: int, _frame: FrameType | None) -> None:
            self._signals += 1
            if self._signals > 1:
                log.warning("second signal: exiting now; unfinished leases will be rescued")
                os._exit(1)
            log.info("signal %s: finishing the current transaction, releasing the rest", signum)
            self.stop()

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore


def refuse_foreign_clock(runtime: Runtime) -> None:
    """Refuse a test clock that another process holds — for a worker (on a frozen clock no
    lease expires and no retry falls due) and for `oncebox prune` (an offset clock would prune
    what is not yet due) — unless the caller runs on simulated time on purpose
    (`simulated_time`, `--simulated-time`). A setting this process wrote is its own business (a
    test that freezes the clock and works in-process); a lapsed one is real time."""
    setting = runtime.store.clock_get()
    if setting.is_real or not setting.foreign:
        return
    raise ClockHeld(
        f"the database clock of {runtime.where} is {setting.describe()} — a test or "
        "the demo holds it; if that process is gone, run `oncebox clock reset --reason "
        "...` (or pass --simulated-time to run on it on purpose)"
    )
