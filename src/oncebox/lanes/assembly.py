"""How a box's lanes are built: a consumer on its own connection, a dispatcher over the box's
channels. Used by the worker, and by `Box.consumer()` / `Box.dispatcher()` for tests and tools."""

from __future__ import annotations

import logging
import os
import random
import socket

from oncebox.brokers.brokered import refuse_unbrokerable, wire_for
from oncebox.kernel.errors import ConfigurationError
from oncebox.lanes.consumer import SQLITE_BUDGET, Consumer, ConsumerConfig
from oncebox.queue.transport import Delivery, TableTransport, Transport
from oncebox.queue.watch import HandlerWatch
from oncebox.runtime.runtime import Runtime
from oncebox.store.allocation import holds_slot
from oncebox.store.params import ConsumerSettings

log = logging.getLogger("oncebox.worker")


def worker_name(index: int | str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{index}"


def build_consumer(
    runtime: Runtime,
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
    tasks = runtime.registry.all()
    if not tasks:
        raise ConfigurationError("this box has no tasks registered; there is nothing to work on")
    longest = max(task.timeout for task in tasks)
    # A hung handler's transaction is ended by the server after its timeout plus grace.
    worker = worker_name(name)
    session = runtime.store.consumer_session(
        ConsumerSettings(
            lock_timeout=config.lock_timeout,
            transaction_timeout=longest + watch.grace_delta,
            application_name=f"oncebox {worker}"[:63],
        )
    )
    lease = config.lease
    if runtime.store.dialect == "sqlite":
        # Heartbeats cannot run while a SQLite transaction holds the write lock: the lease must
        # outlast one transaction on its own.
        budget = SQLITE_BUDGET if config.transaction_budget is None else config.transaction_budget
        lease = max(lease, longest + watch.grace_delta + budget)
    transport = transport or TableTransport(
        session,
        tasks=[task.name for task in tasks],
        queues=list(queues or sorted({task.queue for task in tasks})),
        worker=worker,
        lease_for=lease,
        next_due=runtime.store.job_next_due,
        allowed=runtime.key_guard.allowed,
        limits=runtime.registry.limit_plan(),
    )

    def note(delivery: Delivery, text: str) -> None:
        if delivery.job_id is not None:
            runtime.store.job_attempt_note(delivery.job_id, delivery.attempt, worker, text)
        log.warning("job %s: %s", delivery.job_id, text)

    consumer = Consumer(
        outbox=runtime.outbox_writer,
        registry=runtime.registry,
        session=session,
        transport=transport,
        config=config,
        metrics=runtime.metrics,
        watch=watch,
        now=runtime.store.clock_now,
        rng=rng or runtime.rng,
        worker=worker,
        note_superseded=note,
    )
    consumer.may_render = lambda task: bool(runtime.key_guard.allowed([task]))
    consumer.orm = runtime.orm
    plan = runtime.registry.limit_plan()
    consumer.holds_slot = lambda task: holds_slot(plan, task)
    if isinstance(transport, TableTransport):
        transport.slots = consumer.slots
    return consumer, transport


def broker_transport(
    runtime: Runtime, queue: str, config: ConsumerConfig, name: str = "c0"
) -> Transport:
    """A consumer lane's transport on the broker that holds `queue` (its own connection,
    declared), prefetching what one lease takes at most; on PostgreSQL it settles the relayed
    jobs' rows (migration 0016), on SQLite it takes unrecorded messages only."""
    from oncebox.brokers.transport import BrokerTransport  # noqa: PLC0415

    for task in runtime.registry.all():
        if task.queue == queue:
            refuse_unbrokerable(task, recorded=runtime.store.dialect == "postgres")
    wire = wire_for(runtime.brokers[queue], queue, prefetch=config.batch_size)
    wire.declare()
    return BrokerTransport(
        wire,
        attempts=lambda task: runtime.registry.get(task).retry.max_attempts,
        now=runtime.store.clock_now,
        store=runtime.store if runtime.store.dialect == "postgres" else None,
        worker=worker_name(name),
    )
