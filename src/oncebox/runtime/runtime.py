"""`Runtime`: what every lane is handed — the store, the task registry, the channels, the secret,
the key guard, the clock, the metrics — instead of the `Box` façade.

`Box` builds one runtime and keeps declaring into it (tasks, channels, schedules, sweepers), so a
lane built from it sees what the user declared; nothing below the façade imports `oncebox.box`,
and the dependency graph runs one way: façade → lanes → domain → store.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from oncebox.brokers.brokered import wire_for
from oncebox.jobs.declarations import LimitDeclarations
from oncebox.jobs.keyguard import KeyGuard
from oncebox.jobs.tasks import Registry
from oncebox.kernel.metrics import Metrics
from oncebox.outbox.channels import Channel, ChannelSet
from oncebox.outbox.tokens import SecretSource
from oncebox.outbox.writer import OutboxWriter
from oncebox.queue.handler_orm import Orm
from oncebox.retention.policy import Retention
from oncebox.schedules.schedule import Schedule
from oncebox.store.params import EVERY_KIND, WorkKind
from oncebox.store.protocol import Store
from oncebox.timers.sweeper import Sweeper


class Wakeable(Protocol):
    def wake(self, kinds: Collection[WorkKind] = EVERY_KIND) -> None: ...


class LocalWorkers:
    """The workers running in this process, so an enqueue here wakes them at once (other
    processes learn of it through the store's notifications)."""

    def __init__(self) -> None:
        self._workers: list[Wakeable] = []
        self._lock = threading.Lock()

    def attach(self, worker: Wakeable) -> None:
        with self._lock:
            self._workers.append(worker)

    def detach(self, worker: Wakeable) -> None:
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)

    def wake(self, kinds: Collection[WorkKind] = EVERY_KIND) -> None:
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.wake(kinds)


@dataclass
class Runtime:
    """See the module docstring. `schedules` and `sweepers` are the box's own dictionaries, so
    declarations made after the runtime was built are seen by lanes built later."""

    store: Store
    where: str  # the database as it may be shown: no password
    registry: Registry
    channel_set: ChannelSet
    secrets: SecretSource
    metrics: Metrics
    rng: random.Random
    max_payload_bytes: int
    retention: Retention = field(default_factory=Retention)
    schedules: dict[str, Schedule] = field(default_factory=dict)
    sweepers: dict[str, Sweeper] = field(default_factory=dict)
    # queues a broker holds (`box.queue(name, broker=...)`): queue name -> the broker's URL
    brokers: dict[str, str] = field(default_factory=dict)
    # (broker URL, queue, prefetch=, wait_s=) -> a connection to that queue (`brokers/`): the
    # one place a box's lanes, relay and unrecorded publishes get their broker's wire from (the
    # simulation puts its in-memory broker here: `sim/broker.py`)
    wire_for: Callable[..., Any] = field(default=wire_for)
    workers: LocalWorkers = field(default_factory=LocalWorkers)
    orm: Orm | None = None  # `box.use_sqlalchemy()`, Django: what handlers write through
    # the caller's transaction an enqueue joins when given no `connection=` (Django's, inside
    # `transaction.atomic()`); None: the box's own
    ambient_connection: Callable[[], object | None] = field(default=lambda: None)
    key_guard: KeyGuard = field(init=False)
    limit_declarations: LimitDeclarations = field(init=False)

    def __post_init__(self) -> None:
        self.key_guard = KeyGuard(self.store, self.registry.all, self.schedules.values)
        self.limit_declarations = LimitDeclarations(self.store, self.registry.all)

    @property
    def channels(self) -> dict[str, Channel]:
        """The declared channels; an `email` channel exists unless declared otherwise."""
        return self.channel_set.all()

    def now(self) -> datetime:
        """The store's clock: the one time every process of a deployment (or a test) shares."""
        return self.store.clock_now()

    def outbox_writer(
        self, intent_key: str | None, job_id: int | None, written_at: datetime
    ) -> OutboxWriter:
        """`ctx.outbox` for one handler run; messages are dated `written_at` — the database's
        time when the job was leased (no query per message, and exact under a frozen clock)."""
        return OutboxWriter(
            intent_key=intent_key,
            job_id=job_id,
            channels=self.channels,
            secret=self.secrets.get,
            now=lambda: written_at,
        )
