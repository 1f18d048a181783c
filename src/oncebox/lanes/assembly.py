"""How a box's lanes are built — the one place in oncebox that builds one (a test checks:
tests/test_layout.py): a consumer on its own connection, a dispatcher over the box's
channels, the lease keeper and rescuer, the resolver, the scheduler, a sweeper's lane, the pruner
and the given-up sweep, each from the runtime. Used by the worker, and by `Box.consumer()`,
`Box.dispatcher()`, `Box.ticker()`, `Box.expiry_sweeper()`, `oncebox.testing.drain` and the
commands, so that a lane built for a test or a tool is the worker's."""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from oncebox.brokers.brokered import refuse_unbrokerable
from oncebox.kernel.errors import ConfigurationError
from oncebox.lanes.consumer import SQLITE_BUDGET, Consumer, ConsumerConfig
from oncebox.lanes.delivery_rescuer import DeliveryRescuer, DeliveryRescuerConfig
from oncebox.lanes.dispatcher import DispatcherConfig, OutboxDispatcher
from oncebox.lanes.expiry_sweeper import ExpirySweeper, ExpirySweeperConfig
from oncebox.lanes.lease_keeper import LeaseKeeper, LeaseKeeperConfig
from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.lanes.pruner import Pruner, PrunerConfig
from oncebox.lanes.resolver import AmbiguityResolver, ResolverConfig
from oncebox.lanes.ticker import ScheduleTicker, TickerConfig
from oncebox.outbox.channels import Channel
from oncebox.queue.transport import Delivery, TableTransport, Transport
from oncebox.queue.watch import HandlerWatch
from oncebox.retention.policy import Plan
from oncebox.runtime.runtime import Runtime
from oncebox.store.allocation import holds_slot
from oncebox.store.params import ConsumerSettings
from oncebox.timers.sweeper import Sweeper

if TYPE_CHECKING:
    from oncebox.lanes.given_up import GivenUpSweep, GivenUpSweepConfig

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
    wire = runtime.wire_for(runtime.brokers[queue], queue, prefetch=config.batch_size)
    wire.declare()
    return BrokerTransport(
        wire,
        attempts=lambda task: runtime.registry.get(task).retry.max_attempts,
        now=runtime.store.clock_now,
        store=runtime.store if runtime.store.dialect == "postgres" else None,
        worker=worker_name(name),
    )


def build_dispatcher(
    runtime: Runtime,
    config: DispatcherConfig,
    channels: Mapping[str, Channel],
    *,
    name: str = "d0",
    rng: random.Random,
) -> OutboxDispatcher:
    """A dispatcher lane over `channels` (a worker's: the box's, when it dispatches)."""
    return OutboxDispatcher(
        runtime.store, channels, config, runtime.metrics, worker=worker_name(name), rng=rng
    )


def build_lease_keeper(
    runtime: Runtime,
    config: LeaseKeeperConfig,
    watch: HandlerWatch,
    held_tokens: Callable[[], list[str]],
    keep_alive: Callable[[timedelta], None] | None = None,
) -> LeaseKeeper:
    """The heartbeat of the leases `held_tokens` names (and `keep_alive`: a broker's holds)."""
    return LeaseKeeper(runtime.store, config, watch, held_tokens, keep_alive)


def build_delivery_rescuer(
    runtime: Runtime,
    channels: Mapping[str, Channel],
    config: DeliveryRescuerConfig | None = None,
) -> DeliveryRescuer:
    """Expired outbox leases of `channels` (rows of the others are left to a worker that knows
    them)."""
    return DeliveryRescuer(runtime.store, channels, runtime.metrics, config=config)


def build_lease_rescuer(
    runtime: Runtime,
    config: LeaseRescuerConfig,
    channels: Mapping[str, Channel],
    *,
    brokered: Mapping[str, Sequence[str]] | None = None,
) -> LeaseRescuer:
    """Expired job leases, and in the same round the expired outbox leases of `channels`; the
    box's tasks declared without limits handed back to the unlimited lease, and the ready jobs
    of the broker-held queues in `brokered` (with their tasks) to the relay."""
    return LeaseRescuer(
        runtime.store,
        config,
        runtime.metrics,
        build_delivery_rescuer(runtime, channels),
        unlimited=[t.name for t in runtime.registry.all() if t.limits is None],
        brokered=brokered,
    )


def build_resolver(
    runtime: Runtime, channels: Mapping[str, Channel], config: ResolverConfig | None = None
) -> AmbiguityResolver:
    """The resolver of `channels`' held rows (those a provider can settle: `active`)."""
    return AmbiguityResolver(runtime.store, channels, config=config)


def build_ticker(
    runtime: Runtime, config: TickerConfig | None = None, *, owner: str | None = None
) -> ScheduleTicker:
    """The scheduler lane of every schedule of the box. `owner`: the name its fan-outs are
    fenced on (default: this process's); two tickers in one process need two names, or each
    would pass for the other."""
    name = worker_name("scheduler") if owner is None else owner
    return ScheduleTicker(runtime, runtime.schedules, name, config=config)


def build_expiry_sweeper(
    runtime: Runtime, sweeper: Sweeper, config: ExpirySweeperConfig
) -> ExpirySweeper:
    """One declared sweeper's lane, on its own connection: `close()` it after."""
    return ExpirySweeper(runtime, sweeper, config=config)


def build_pruner(runtime: Runtime, config: PrunerConfig, plan: Plan | None = None) -> Pruner:
    """The pruner of the box's retention (`plan`: the one already read from it)."""
    if plan is None:
        return Pruner.for_runtime(runtime, config)
    return Pruner(runtime.store, config, plan)


def build_given_up_sweep(
    runtime: Runtime,
    brokers: Mapping[str, str],
    config: GivenUpSweepConfig | None = None,
    *,
    worker: str = "",
) -> GivenUpSweep:
    """The sweep of what the brokers of `brokers` (queue → its broker's URL) gave up on."""
    from oncebox.lanes.given_up import GivenUpSweep  # noqa: PLC0415 (a broker's modules)

    return GivenUpSweep(runtime.store, brokers, runtime.wire_for, config, worker=worker)
