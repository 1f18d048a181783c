"""The worker process: consumer threads plus the lanes that keep leases honest.

Lanes, each in its own thread:
- consumers (`concurrency` of them): lease a batch, run consumer transactions (`consumer.py`);
  idle, they wait for a wake-up — a NOTIFY on PostgreSQL, an enqueue in this process, the next
  due job, or the poll interval, whichever comes first;
- the lease keeper: heartbeats held leases; the watchdog for hung handlers (`heartbeat.py`);
- the lease rescuer: expired leases back to ready or dead (`rescuer.py`);
- the pruner: finished-job retention and explicit intent policies (`pruner.py`);
- the listener (PostgreSQL only): LISTEN for new jobs.

Shutdown is graceful: SIGTERM or SIGINT stops claiming, lets the running transaction finish and
gives back leased jobs it has not started, without spending their attempt. A second signal exits
at once (the leases then expire and are rescued).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING

from oncebox.consumer import Consumer, ConsumerConfig, ConsumerResult
from oncebox.errors import ConfigurationError, StoreUnavailable
from oncebox.heartbeat import LeaseKeeper, LeaseKeeperConfig
from oncebox.pruner import Pruner, PrunerConfig
from oncebox.rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.store.base import ConsumerSettings
from oncebox.store.migrations import check_runnable
from oncebox.transport import Delivery, TableTransport, Transport
from oncebox.watch import HandlerWatch

if TYPE_CHECKING:
    from oncebox.box import Box

log = logging.getLogger("oncebox.worker")


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker runs. `poll_interval` defaults to 5 s on PostgreSQL (NOTIFY wakes it sooner)
    and 1 s on SQLite (which has no notifications)."""

    concurrency: int = 1
    queues: tuple[str, ...] | None = None
    until_idle: bool = False
    poll_interval: timedelta | None = None
    handler_grace: timedelta = timedelta(seconds=10)
    exit_on_hung_handler: bool = True
    consumer: ConsumerConfig = field(default_factory=ConsumerConfig)
    rescuer: LeaseRescuerConfig = field(default_factory=LeaseRescuerConfig)
    pruner: PrunerConfig = field(default_factory=PrunerConfig)

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 256:
            raise ConfigurationError("concurrency must be within 1..256")
        if self.poll_interval is not None and self.poll_interval <= timedelta(0):
            raise ConfigurationError("poll_interval must be positive")


def worker_name(index: int | str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{index}"


def build_consumer(
    box: Box,
    config: ConsumerConfig,
    watch: HandlerWatch,
    *,
    queues: tuple[str, ...] | None = None,
    name: str = "c0",
    rng: random.Random | None = None,
    transport: Transport | None = None,
) -> tuple[Consumer, Transport]:
    """A consumer with its own dedicated connection, on the built-in table queue unless another
    transport is given."""
    tasks = box.registry.all()
    if not tasks:
        raise ConfigurationError("this box has no tasks registered; there is nothing to work on")
    longest = max(task.timeout for task in tasks)
    # A hung handler's transaction is ended by the server after its timeout plus grace.
    worker = worker_name(name)
    session = box.store.consumer_session(
        ConsumerSettings(
            lock_timeout=config.lock_timeout,
            transaction_timeout=longest + watch.grace_delta,
            application_name=f"oncebox {worker}"[:63],
        )
    )
    lease = config.lease
    if box.store.dialect == "sqlite":
        # Heartbeats cannot run while a SQLite transaction holds the write lock: the lease must
        # outlast one transaction on its own.
        lease = max(lease, longest + watch.grace_delta + config.transaction_budget)
    transport = transport or TableTransport(
        session,
        tasks=[task.name for task in tasks],
        queues=list(queues or sorted({task.queue for task in tasks})),
        worker=worker,
        lease_for=lease,
        next_due=box.store.job_next_due,
    )

    def note(delivery: Delivery, text: str) -> None:
        if delivery.job_id is not None:
            box.store.job_attempt_note(delivery.job_id, delivery.attempt, worker, text)
        log.warning("job %s: %s", delivery.job_id, text)

    consumer = Consumer(
        registry=box.registry,
        session=session,
        transport=transport,
        config=config,
        metrics=box.metrics,
        watch=watch,
        now=box.store.clock_now,
        rng=rng or box.rng,
        worker=worker,
        note_superseded=note,
    )
    return consumer, transport


@dataclass
class WorkerResult:
    consumed: ConsumerResult = field(default_factory=ConsumerResult)


class Worker:
    def __init__(self, box: Box, config: WorkerConfig | None = None) -> None:
        self.box = box
        self.config = config or WorkerConfig()
        self.stop_event = threading.Event()
        self._wakes: list[threading.Event] = []
        self._idle: set[int] = set()
        self._idle_lock = threading.Lock()
        self._result = WorkerResult()
        self._result_lock = threading.Lock()
        self._signals = 0
        self._error: Exception | None = None
        self.watch = HandlerWatch(self.config.handler_grace, self.config.exit_on_hung_handler)

    @property
    def poll_interval(self) -> float:
        if self.config.poll_interval is not None:
            return self.config.poll_interval.total_seconds()
        return 5.0 if self.box.store.supports_notifications else 1.0

    def wake(self) -> None:
        """New work may exist (an enqueue in this process, a NOTIFY): wake idle consumers."""
        for event in self._wakes:
            event.set()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake()

    def run(self) -> WorkerResult:
        """Run until stopped (or idle, with `until_idle`)."""
        check_runnable(self.box.store.schema_status(), self.box.where)
        if not self.box.store.clock_get().is_real:
            log.warning(
                "the database clock of %s is frozen or offset (%s): only tests should do that",
                self.box.where,
                self.box.store.clock_get(),
            )
        restore = self._install_signal_handlers()
        consumers = [
            build_consumer(
                self.box,
                self.config.consumer,
                self.watch,
                queues=self.config.queues,
                name=f"c{i}",
                rng=random.Random(self.box.rng.random()),
            )
            for i in range(self.config.concurrency)
        ]

        def tokens() -> list[str]:
            return [token for _c, transport in consumers for token in transport.held_tokens()]

        keeper = LeaseKeeper(
            self.box.store, LeaseKeeperConfig(self.config.consumer.lease), self.watch, tokens
        )
        rescuer = LeaseRescuer(self.box.store, self.config.rescuer, self.box.metrics)
        pruner = Pruner(self.box.store, self.config.pruner, self.box.registry.all())
        rescuer.run_once()
        threads = [
            threading.Thread(
                target=keeper.run_forever,
                args=(self.stop_event,),
                name="oncebox-lease-keeper",
                daemon=True,
            ),
            threading.Thread(
                target=rescuer.run_forever,
                args=(self.stop_event,),
                name="oncebox-rescuer",
                daemon=True,
            ),
            threading.Thread(
                target=pruner.run_forever,
                args=(self.stop_event,),
                name="oncebox-pruner",
                daemon=True,
            ),
        ]
        if self.box.store.supports_notifications:
            threads.append(
                threading.Thread(target=self._listen, name="oncebox-listener", daemon=True)
            )
        workers = []
        for index, (consumer, _transport) in enumerate(consumers):
            wake = threading.Event()
            self._wakes.append(wake)
            consumer.stopping = self.stop_event.is_set
            workers.append(
                threading.Thread(
                    target=self._consume,
                    args=(index, consumer, wake),
                    name=f"oncebox-consumer-{index}",
                )
            )
        self.box.attach_worker(self)
        try:
            for thread in threads + workers:
                thread.start()
            for thread in workers:
                while thread.is_alive():
                    thread.join(0.5)
        finally:
            self.stop()
            self.box.detach_worker(self)
            for thread in threads:
                thread.join(5)
            for consumer, _transport in consumers:
                consumer.session.close()
            restore()
        if self._error is not None:
            raise self._error
        return self._result

    # -- consumer threads ----------------------------------------------------------------------

    def _consume(self, index: int, consumer: Consumer, wake: threading.Event) -> None:
        backoff = 0.0
        while not self.stop_event.is_set():
            wake.clear()
            self._set_idle(index, False)  # busy until a round of its own finds nothing
            try:
                result = consumer.run_once()
                backoff = 0.0
            except StoreUnavailable as exc:
                backoff = min(max(backoff * 2, 0.5), 30.0)
                log.warning("consumer %s: %s; retrying in %.1fs", index, exc, backoff)
                self.stop_event.wait(backoff)
                continue
            except Exception as exc:
                if self.config.until_idle:  # a run meant to finish fails loudly, and ends
                    self._error = self._error or exc
                    self.stop()
                    return
                backoff = min(max(backoff * 2, 0.5), 30.0)
                log.exception("consumer %s failed a round; retrying in %.1fs", index, backoff)
                self.stop_event.wait(backoff)
                continue
            with self._result_lock:
                self._result.consumed.add(result)
            if result.leased:
                continue
            if self.config.until_idle and self._set_idle(index, True):
                self.stop()
                return
            wake.wait(self._idle_wait(consumer))

    def _set_idle(self, index: int, idle: bool) -> bool:
        """Mark a consumer idle or busy; True when every consumer is idle."""
        with self._idle_lock:
            if idle:
                self._idle.add(index)
            else:
                self._idle.discard(index)
            return len(self._idle) == self.config.concurrency

    def _idle_wait(self, consumer: Consumer) -> float:
        wait = self.poll_interval
        try:
            due = consumer.transport.next_due()
        except StoreUnavailable:
            return wait
        if due is not None:
            until = (due - self.box.store.clock_now()).total_seconds()
            # a due job the lease did not take (its group's head is busy or retrying) is not
            # worth spinning for: wait the poll interval then
            if until > 0:
                wait = min(wait, until)
        return wait

    def _listen(self) -> None:
        while not self.stop_event.is_set():
            try:
                if self.box.store.wait_for_jobs(timeout=1.0):
                    self.wake()
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
