"""One world: a store, a box declared as a user would, the lanes that run its work, and its
parts.

The lanes are every world's: two consumers, two dispatchers, the lease rescuer (which rescues
the outbox's expired leases too), the resolver, an operator (replay, discard, cancel, resolve),
and the clock, which moves the store's frozen time by small steps and, now and then, past every
lease. The parts (`sim/parts/`, in `PARTS` order) declare the tasks, their enqueuers and their
own invariants: the notices and their channels in every world, and, each in one world of two by
the seed, limits, debounce and throttle, ordered groups, enqueues in the caller's transaction,
retention, the HTTP API's Idempotency-Key records, providers' reports and a schedule's
fan-outs. Everything is small on purpose, so that actors collide: a handful of customers make
every key wanted by several enqueues, every job leased by several consumers.

A crashed actor is started again at once, as a supervisor restarts a worker: a new lane, a new
session, nothing carried over.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from oncebox.box import Box
from oncebox.kernel.clock import ClockSetting
from oncebox.kernel.errors import OnceboxError, StoreUnavailable
from oncebox.lanes.assembly import build_consumer, build_lease_rescuer, build_resolver
from oncebox.lanes.consumer import ConsumerConfig
from oncebox.lanes.dispatcher import DispatcherConfig
from oncebox.lanes.lease_rescuer import LeaseRescuerConfig
from oncebox.queue.watch import HandlerWatch
from oncebox.sim.choices import Choices
from oncebox.sim.leases import LeaseEnds
from oncebox.sim.parts import Body, Part, Starter
from oncebox.sim.parts.brokered import Brokered
from oncebox.sim.parts.caller import CallerTransactions
from oncebox.sim.parts.collapse import Collapsing
from oncebox.sim.parts.limits import Limited
from oncebox.sim.parts.notices import Notices
from oncebox.sim.parts.ordered import Ordered
from oncebox.sim.parts.reports import Reported
from oncebox.sim.parts.requests import Requests
from oncebox.sim.parts.retained import Retained
from oncebox.sim.parts.schedules import Schedules
from oncebox.sim.providers import SimProvider
from oncebox.sim.scheduler import Scheduler
from oncebox.sim.yields import YieldingStore
from oncebox.store import open_store
from oncebox.store.params import JobFilter, OutboxFilter
from oncebox.store.records import OutboxState

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
PARTS: tuple[Callable[[World], Part], ...] = (
    Notices,
    Limited,
    Collapsing,
    Ordered,
    CallerTransactions,
    Retained,
    Requests,
    Reported,
    Schedules,
    Brokered,
)
# The lanes that run on once faults stop, until nothing is due (the clock moves time on).
LANES_KEPT = (
    "consumer-1",
    "consumer-2",
    "dispatcher-1",
    "dispatcher-2",
    "rescuer",
    "resolver",
    "clock",
)
# The operator works on in the quiet phase too: the next morning's replays, resolutions and
# discards are what brings a held or dead message back, and they must meet the lanes at work.
OPERATOR = ("operator",)
# How far the clock actor moves time, by choice: steps that leave leases alone, then past them.
CLOCK_STEPS = (
    timedelta(seconds=1),
    timedelta(seconds=5),
    timedelta(seconds=20),
    LEASE + timedelta(seconds=1),
    timedelta(minutes=10),
)
SECRET = "sim-secret-0123456789abcdef"  # noqa: S105 (the tokens' HMAC key in a throwaway world)


@dataclass
class World:
    """See the module docstring. `wanted` are the keys some enqueue asked for: the eligible
    keys, each of which must reach an end state once the faults stop."""

    url: str
    scheduler: Scheduler
    choices: Choices
    box: Box = field(init=False)
    real: Any = field(init=False)
    store: YieldingStore = field(init=False)
    parts: list[Part] = field(init=False)
    wanted: set[str] = field(default_factory=set)
    providers: dict[str, SimProvider] = field(default_factory=dict)
    holders: dict[str, str] = field(default_factory=dict)  # a lease's `leased_by` -> its actor
    collapsed_elsewhere: int = 0  # enqueues outside `collapse` that joined a pending job (K2)
    now: datetime = START
    quiet: bool = False  # the faults have stopped: time runs on to the next thing due
    _closers: list[Callable[[], None]] = field(default_factory=list)
    _variants: dict[Callable[[World], Part], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.real = open_store(self.url, migrate=True)
        self.real.clock_set(ClockSetting(frozen_at=START))
        self.store = YieldingStore(self.real, self.scheduler)
        self.scheduler.on_crash = self.store.drop_sessions
        self.box = Box(store=self.store, secret=SECRET, seed=0)
        self.parts = [make(self) for make in self._chosen(PARTS)]
        self.parts.append(LeaseEnds(self.scheduler.moved, self.holders, self.clock_now))

    def _chosen(self, parts: tuple[Callable[[World], Part], ...]) -> list[Callable[[World], Part]]:
        """The notices in every world (their channels are the lanes' own work); each other part
        by the seed, one world in two. With every part in, each actor would step too seldom in
        the steps with faults for races to meet, and a world would cost the sum of them all; a
        shrink, lowering a choice to 0, leaves out a part the failure does not need.

        A part with variants (`Part.variants`, a power of two: the limits part's rolling
        deploy) is drawn with its variant in the same choice, `below(2 * variants)`: CPython's
        `randrange` draws it from the same word of the generator as `below(2)`, its high bit
        that answer, so a variant added moves no world but its own (`variant_of`: 0 is the
        world the part made before)."""
        chosen: list[Callable[[World], Part]] = []
        for make in parts:
            if make is Notices:
                chosen.append(make)
                continue
            variants = getattr(make, "variants", 1)
            drawn = self.choices.below(2 * variants)
            if drawn >= variants:
                self._variants[make] = drawn - variants
                chosen.append(make)
        return chosen

    def variant_of(self, part: Callable[[World], Part]) -> int:
        """Which of its variants a part chosen in this world is (0: its first)."""
        return self._variants.get(part, 0)

    @property
    def notices(self) -> Notices:
        return next(part for part in self.parts if isinstance(part, Notices))

    @property
    def mail(self) -> SimProvider:
        return self.notices.mail

    @property
    def hook(self) -> SimProvider:
        return self.notices.hook

    def clock_now(self) -> datetime:
        """The store's frozen time, as the run has moved it (the providers' clock)."""
        return self.now

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        with contextlib.suppress(Exception):
            self.box.runtime.channel_set.close()
        self.real.close()

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> dict[str, Starter]:
        """Each actor's name and how to start it (again, after a crash): a factory of its
        body, so a restart builds new lanes with new sessions. The lanes, then each part's."""
        actors: dict[str, Starter] = {
            "consumer-1": lambda: self._consumer("c1", "consumer-1"),
            "consumer-2": lambda: self._consumer("c2", "consumer-2"),
            "dispatcher-1": lambda: self._dispatcher("d1", "dispatcher-1"),
            "dispatcher-2": lambda: self._dispatcher("d2", "dispatcher-2"),
            "rescuer": self._rescuer,
            "resolver": self._resolver,
            "operator": lambda: self.loop(self._operate),
            "clock": lambda: self.loop(self._tick),
        }
        for part in self.parts:
            for name, start in part.actors().items():
                assert name not in actors, f"two parts name the actor {name}"
                actors[name] = start
        return actors

    def kept(self) -> tuple[str, ...]:
        """The actors that run on once faults stop: the lanes, the operator, and those the parts
        keep."""
        return LANES_KEPT + OPERATOR + tuple(name for part in self.parts for name in part.keep)

    def loop(self, round_: Callable[[], object]) -> Body:
        """A body that runs `round_` again and again, with a yield point between rounds."""

        def body() -> None:
            while True:
                # a lost connection, a refusal: the lane's own loop would go on
                with contextlib.suppress(StoreUnavailable, OnceboxError):
                    round_()
                self.scheduler.point("idle")

        return body

    def _built(self, build: Callable[[], Callable[[], object]]) -> Callable[[], None]:
        """A body that builds its lane in its own thread (so its sessions are its own, and die
        with it), then runs its rounds."""

        def body() -> None:
            self.loop(build())()

        return body

    def _consumer(self, name: str, actor: str) -> Callable[[], None]:
        self.holders[f"sim-{name}"] = actor
        config = ConsumerConfig(
            batch_size=2,
            max_batch_size=2,
            lease=LEASE,
            lock_timeout=timedelta(hours=1),  # a wait is the scheduler's to end, never a timer
        )
        runtime = self.box.runtime
        # the table's queues: a broker-held queue's jobs are its own lanes' (`parts/brokered.py`)
        tabled = tuple(sorted({t.queue for t in runtime.registry.all()} - set(runtime.brokers)))
        watch = HandlerWatch(exit_on_hang=False)
        return self._built(
            lambda: (
                build_consumer(runtime, config, watch, queues=tabled, name=f"sim-{name}")[
                    0
                ].run_once
            )
        )

    def _dispatcher(self, name: str, actor: str) -> Callable[[], None]:
        self.holders[name] = actor
        config = DispatcherConfig(batch_size=2, lease=LEASE)
        return self._built(lambda: self.box.dispatcher(config, name=name).run_once)

    def _rescuer(self) -> Callable[[], None]:
        runtime, channels = self.box.runtime, self.box.channels
        brokered = {  # PostgreSQL: a replayed job of a broker-held queue goes to the relay
            queue: [t.name for t in runtime.registry.all() if t.queue == queue]
            for queue in runtime.brokers
        }
        if self.real.dialect != "postgres":
            brokered = {}
        return self._built(
            lambda: (
                build_lease_rescuer(
                    runtime, LeaseRescuerConfig(), channels, brokered=brokered or None
                ).run_once
            )
        )

    def _resolver(self) -> Callable[[], None]:
        runtime, channels = self.box.runtime, self.box.channels
        return self._built(lambda: build_resolver(runtime, channels).run_once)

    def _tick(self) -> None:
        """Time passes for every process at once: the store's clock and the monotonic clock
        every lane paces itself by move together."""
        step = CLOCK_STEPS[self.choices.below(len(CLOCK_STEPS))]
        self.scheduler.point("clock")
        if self.quiet:
            step = max(step, self._until_next_due())
        self.now += step
        self.scheduler.elapsed += step.total_seconds()
        self.real.clock_set(ClockSetting(frozen_at=self.now))
        for part in self.parts:  # what threads of their own do while time passes
            part.time_passed()

    def _until_next_due(self) -> timedelta:
        """Once faults stop, how long until a job, a message or a lease falls due (none: no
        wait): the lanes would only find nothing meanwhile, so time passes at once."""
        upcoming: datetime | None = self.real.status_times().next_event()
        if upcoming is None or upcoming <= self.now:
            return timedelta(0)
        return upcoming - self.now + timedelta(seconds=1)

    def _operate(self) -> None:
        """What an operator does the next morning, each through the box and audited: replay a
        dead job, cancel a waiting one, resolve a held send (it arrived, or send it again),
        replay or discard a dead message."""
        store = self.box.store
        what = self.choices.below(4)
        with contextlib.suppress(OnceboxError):
            if what in (0, 1):
                jobs = store.job_list(JobFilter(state="dead" if what == 0 else "ready", limit=8))
                if jobs:
                    job = jobs[self.choices.below(len(jobs))]
                    if what == 0:
                        self.box.replay(job.id, reason="sim: the next morning", actor="sim")
                    else:
                        self.box.cancel(job.id, reason="sim: no longer wanted", actor="sim")
                return
            state: OutboxState = "ambiguous" if what == 2 else "dead"
            rows = store.outbox_list(OutboxFilter(state=state, limit=8))
            if not rows:
                return
            row = rows[self.choices.below(len(rows))]
            if what == 2:
                resolution: Literal["sent", "resend"] = (
                    "sent" if self.choices.below(2) == 0 else "resend"
                )
                self.box.resolve(row.id, resolution, reason="sim: checked", actor="sim")
            elif self.choices.below(2) == 0:
                self.box.replay(row.id, reason="sim: redrive", actor="sim", kind="delivery")
            else:
                self.box.discard(row.id, reason="sim: not wanted", actor="sim")
