"""The workload every scenario runs — the freight app's weekly digest — and its worker processes.

A worker process is started with `spawn` (a fresh interpreter: nothing inherited but its
arguments), builds the same box as the harness, installs the fault plan's actions at named
points, and works until idle. The harness drives the one clock they all read (the database's).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import resource
import signal
import sys
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from oncebox import Box, Concurrency, Reports, Retry, WorkerConfig
from oncebox.chaos import mutations
from oncebox.chaos.history import HistoryWriter
from oncebox.chaos.recording import RecordingProvider
from oncebox.examples.logistics.app import SENDER, build_box
from oncebox.jobs.periods import iso_week
from oncebox.kernel import clock, points
from oncebox.kernel.clock import ClockLease
from oncebox.kernel.errors import ClockHeld, StoreUnavailable
from oncebox.lanes.consumer import ConsumerConfig
from oncebox.lanes.dispatcher import DispatcherConfig
from oncebox.lanes.lease_rescuer import LeaseRescuerConfig
from oncebox.providers import from_url
from oncebox.retention.policy import Retention
from oncebox.testing import RedeliveringTransport

Action = Literal["kill", "stop", "pause", "raise", "full"]
CHANNEL_RETRY = Retry(max_attempts=4, base_delay=timedelta(seconds=30))
Term = Literal["backoff", "pause", "job_lease", "dispatcher_lease", "clock", "outage"]


@dataclass(frozen=True)
class Timing:
    """A run on the real clock: no test clock at all, and leases, backoffs and pauses of a
    second or so, so that what a deployment waits minutes for settles here in seconds.

    `bound(dialect, terms)` is the liveness bound these settings imply for the faults a scenario
    injected (`terms`), term by term as docs/guarantees.md states it with the defaults, plus
    `startup_s` for the worker processes the harness starts after the faults (an interpreter,
    imports, a connection: seconds on a loaded machine, not part of the guarantee)."""

    consumer_lease_s: float = 2.0
    dispatcher_lease_s: float = 3.0
    rescue_every_s: float = 0.25
    handler_timeout_s: float = 1.0
    handler_grace_s: float = 0.5
    max_delay_s: float = 0.5  # the longest retry backoff, jobs and messages
    max_pause_s: float = 1.0  # the longest channel pause
    clock_lease_s: float = 1.0  # ONCEBOX_CLOCK_LEASE of a process holding a test clock
    idle_horizon_s: float = 30.0
    outage_s: float = 1.0  # how long a store outage the harness injects lasts
    startup_s: float = 15.0
    limits: tuple[str, ...] = ()  # the channel's rate limits
    busy_timeout_s: float | None = None  # SQLite's, when a scenario wants writers to give up
    handler_s: tuple[float, float] = (0.0, 0.0)  # each digest handler's own work, at least

    def job_lease_s(self, dialect: str) -> float:
        """On SQLite a lease must outlast one transaction: the handler's timeout and grace."""
        if dialect == "sqlite":
            return max(self.consumer_lease_s, self.handler_timeout_s + self.handler_grace_s + 0.1)
        return self.consumer_lease_s

    def bound(self, dialect: str, terms: tuple[Term, ...]) -> float:
        waits = {
            "backoff": self.max_delay_s,
            "pause": self.max_pause_s,
            "job_lease": self.job_lease_s(dialect) + self.rescue_every_s,
            "dispatcher_lease": self.dispatcher_lease_s + self.rescue_every_s,
            "clock": self.clock_lease_s,
            # the outage itself, and the lanes' backoff while the store was away (0.5 s, 1 s)
            "outage": self.outage_s + 2.0,
        }
        return self.startup_s + sum(waits[term] for term in terms)


@dataclass(frozen=True)
class Workload:
    """What every process of one run shares (picklable: it crosses into spawned processes)."""

    url: str
    email: str
    secret: str
    history: str  # the run's history folder
    seed: int
    ambiguity: Literal["hold", "retry"] = "hold"
    tz: str = "UTC"
    mutations: tuple[str, ...] = ()
    batch_size: int = 5000  # the schedule's fan-out batch
    log_level: int = logging.ERROR  # expected warnings (expired leases, pauses) stay quiet
    timing: Timing | None = None  # a run on the real clock; None: the harness's frozen clock
    sneak: int = 0  # a customer whose digest handler tries to end the claim's transaction
    slots: int = 0  # > 0: the digest task runs under oncebox.Concurrency(slots)
    broker: str | None = None  # a RabbitMQ URL: the digests' queue is the broker's
    digest_queue: str = "default"
    reports: bool = False  # the email channel takes its provider's signed delivery webhooks


@dataclass(frozen=True)
class PointPlan:
    """At the `nth` arrival at `point`, do `action` (`stop`: SIGSTOP this process; `pause`:
    block until the harness releases the gate; `full`: the disk fills up for this process for
    the run's `outage_s`, as SQLite sees it)."""

    point: str
    action: Action
    nth: int = 1


@dataclass
class Gate:
    """A cross-process barrier for `stop` and `pause`: the worker sets `reached`, the harness
    sets `release`. Built from the run's multiprocessing context."""

    reached: Any
    release: Any


@dataclass(frozen=True)
class Lanes:
    consume: bool = True
    dispatch: bool = True
    schedule: bool = True
    sweep: bool = True
    concurrency: int = 1
    batch: int = 20  # consumer and dispatcher batches: several per run, so nth arrivals exist
    heartbeats: bool = True  # False: a stop-the-world stall, heartbeats included


#: the environment variable holding a run's provider-reports signing secret
REPORTS_SECRET_ENV = "ONCEBOX_CHAOS_REPORTS_SECRET"  # noqa: S105 (a variable's name)

#: what a chaos run keeps: every message and attempt, and the audit (see `build`)
CHECKED = Retention(payloads=None, messages=None, delivery_attempts=None, audit=None)


def build(workload: Workload, worker: str) -> Box:
    """The freight box with the run's provider behind a recorder, and the run's mutations."""
    period = mutations.wrong_iso_week() if "period-%Y" in workload.mutations else iso_week
    timing = workload.timing
    url = workload.url
    if timing is not None and timing.busy_timeout_s is not None and url.startswith("sqlite"):
        url = f"{url}?busy_timeout={timing.busy_timeout_s:g}"
    box = build_box(
        url,
        secret=workload.secret,
        tz=workload.tz,
        period=period,
        batch_size=workload.batch_size,
        digest_limits=[Concurrency(workload.slots)] if workload.slots else (),
        digest_queue=workload.digest_queue,
        **_task_timing(timing),
    )
    if workload.broker is not None:
        box.queue(workload.digest_queue, broker=workload.broker)
    # The checker reads every key's messages and attempts after the run, which may move the
    # clock by months (dst-change): retention must not take them first. Jobs go as in production
    # (the checker knows a done job may be pruned).
    box.runtime.retention = CHECKED
    history = HistoryWriter(Path(workload.history), worker, workload.seed)
    box.channel(
        "email",
        provider=RecordingProvider(from_url(workload.email), history),
        sender=SENDER,
        ambiguity=workload.ambiguity,
        reports=Reports(secret_env=REPORTS_SECRET_ENV) if workload.reports else None,
        **_channel_timing(timing),
    )
    mutations.apply(box.store, workload.mutations)
    if workload.sneak:
        _sneak_in(box, workload.sneak)
    if timing is not None and timing.handler_s[1] > 0:
        _slow_down(box, timing.handler_s)
    return box


def _slow_down(box: Box, seconds: tuple[float, float]) -> None:
    """Each digest handler takes a while (the customer's own, seeded) — its own work, as a
    real handler's calls and queries would — while it holds SQLite's write lock."""
    task = box.registry.get("weekly_digest")
    handler = task.fn

    def slow(ctx: Any, customer_id: int, period: str) -> None:
        clock.sleep(random.Random(customer_id).uniform(*seconds))
        handler(ctx, customer_id=customer_id, period=period)

    box.registry._tasks[task.name] = replace(task, fn=slow)  # a harness switch, on purpose


SNEAKS = {
    # what the guard must refuse: transaction control behind comments the naive reading misses
    "postgres": "/* /* nested */ */ COMMIT",
    "sqlite": "/* a comment */ COMMIT",
}


def _sneak_in(box: Box, customer: int) -> None:
    """The digest handler of `customer` first tries to commit the claim's transaction, as a
    handler written against the wrong advice would; the others are untouched."""
    task = box.registry.get("weekly_digest")
    handler = task.fn

    def sneaky(ctx: Any, customer_id: int, period: str) -> None:
        if customer_id == customer:
            ctx.connection.execute(SNEAKS[ctx.dialect])
        handler(ctx, customer_id=customer_id, period=period)

    box.registry._tasks[task.name] = replace(task, fn=sneaky)  # a harness switch, on purpose


def _task_timing(timing: Timing | None) -> dict[str, Any]:
    if timing is None:
        return {}
    delay = timedelta(seconds=timing.max_delay_s)
    return {
        "retry": Retry(max_attempts=5, base_delay=delay / 8, max_delay=delay),
        "timeout": timedelta(seconds=timing.handler_timeout_s),
    }


def _channel_timing(timing: Timing | None) -> dict[str, Any]:
    if timing is None:
        return {"retry": CHANNEL_RETRY}
    delay, pause = timedelta(seconds=timing.max_delay_s), timedelta(seconds=timing.max_pause_s)
    return {
        "retry": Retry(max_attempts=4, base_delay=delay / 8, max_delay=delay),
        "limits": timing.limits,
        "max_pause": pause,
        "default_throttle": pause,
        "pause_on_421": pause,
    }


def worker_config(lanes: Lanes, timing: Timing | None = None) -> WorkerConfig:
    """Until idle. On the harness's frozen clock (simulated time); with `timing`, on the real
    clock with its short leases, waiting up to its horizon for work that falls due."""
    config = WorkerConfig(
        until_idle=True,
        simulated_time=timing is None,
        exit_on_hung_handler=False,
        concurrency=lanes.concurrency,
        consume=lanes.consume,
        dispatch=lanes.dispatch,
        schedule=lanes.schedule,
        sweep=lanes.sweep,
        consumer=ConsumerConfig(batch_size=lanes.batch),
        dispatcher=DispatcherConfig(batch_size=lanes.batch),
    )
    if timing is None:
        return config
    return replace(
        config,
        idle_horizon=timedelta(seconds=timing.idle_horizon_s),
        handler_grace=timedelta(seconds=timing.handler_grace_s),
        consumer=replace(config.consumer, lease=timedelta(seconds=timing.consumer_lease_s)),
        dispatcher=replace(config.dispatcher, lease=timedelta(seconds=timing.dispatcher_lease_s)),
        rescuer=LeaseRescuerConfig(interval=timedelta(seconds=timing.rescue_every_s)),
    )


@dataclass
class _Arrivals:
    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def arrive(self, point: str) -> int:
        with self.lock:
            self.counts[point] = self.counts.get(point, 0) + 1
            return self.counts[point]


def fill_the_disk(seconds: float) -> None:
    """The disk is full, for this process, for `seconds`: every write that would grow a file
    fails with EFBIG (RLIMIT_FSIZE of one byte, SIGXFSZ ignored), which SQLite reports as
    "database or disk is full", as on a full disk; then the limit is lifted again."""
    previous = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, previous[1]))
    threading.Timer(seconds, resource.setrlimit, (resource.RLIMIT_FSIZE, previous)).start()


def _do(action: Action, name: str, gate: Gate | None, outage_s: float) -> None:
    if action == "kill":
        points.kill(name)
    elif action == "raise":
        raise RuntimeError(f"chaos: injected failure at {name}")
    elif action == "full":
        fill_the_disk(outage_s)
        if gate is not None:  # the harness waits for the fault, not for a guess at its timing
            gate.reached.set()
        return
    assert gate is not None, "stop and pause need a gate"
    gate.reached.set()
    if action == "stop":
        # Sent to this thread, not the process: a process-wide SIGSTOP is taken by the thread
        # the kernel wakes (often the main one, blocked in a join), and until that thread runs,
        # this lane goes on with the claim it was frozen before.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    elif not gate.release.wait(120):
        raise TimeoutError(f"chaos: {name} was never released")


def install_plan(
    plans: tuple[PointPlan, ...],
    gate: Gate | None,
    history: HistoryWriter | None = None,
    outage_s: float = 1.0,
) -> None:
    """The fault plan's actions, and (with `history`) a record of every consumer commit and
    every fenced-off settlement: superseded leases must commit nothing (S9). Called in the
    process's main thread (a signal disposition can only be set there)."""
    if any(plan.action == "full" for plan in plans):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, no more
    arrivals = _Arrivals()
    chains: dict[str, list[points.Action]] = {}
    if history is not None:
        chains["consumer.committed"] = [lambda _n: history.write("commit", "ok", history.worker)]
        chains["consumer.lease_lost"] = [
            lambda _n: history.write("commit", "fail", history.worker, "lease superseded")
        ]
    for plan in plans:

        def act(name: str, plan: PointPlan = plan) -> None:
            if arrivals.arrive(name) == plan.nth:
                _do(plan.action, name, gate, outage_s)

        chains.setdefault(plan.point, []).append(act)
    for point, actions in chains.items():

        def run_all(name: str, actions: list[points.Action] = actions) -> None:
            for action in actions:
                action(name)

        points.install(point, run_all)


def worker_main(
    workload: Workload,
    name: str,
    plans: tuple[PointPlan, ...],
    gate: Gate | None,
    lanes: Lanes,
) -> None:
    """A worker process: the run's box, the fault plan, work until idle, exit 0."""
    logging.basicConfig(level=workload.log_level, format=f"{name}: %(levelname)s %(message)s")
    outage = workload.timing.outage_s if workload.timing else 1.0
    install_plan(plans, gate, HistoryWriter(Path(workload.history), name, workload.seed), outage)
    if not lanes.heartbeats:
        _stop_heartbeats()
    box = build(workload, name)
    try:
        box.work(config=worker_config(lanes, workload.timing))
    except ClockHeld as held:  # another process holds a test clock: the harness tries again
        logging.getLogger("oncebox.chaos").warning("%s", held)
        sys.exit(4)
    finally:
        box.close()


def taker_main(workload: Workload, name: str, seconds: float, gate: Gate) -> None:
    """A process that takes the email channel's tokens one at a time, as fast as the bucket
    answers, for `seconds` of real time from `gate.reached` — as a dispatcher's rounds do, only
    more often: what it was granted, and when it began and ended, go into the history."""
    from oncebox.lanes import dispatcher  # noqa: PLC0415 (a mutation may replace its `take`)

    box = build(workload, name)
    history = HistoryWriter(Path(workload.history), name, workload.seed)
    channel = box.channels["email"]
    box.store.rate_bucket_configure(channel.name, channel.bucket_specs())
    names = [limit.name for limit in channel.limits]
    take = getattr(dispatcher, "take")  # noqa: B009 (looked up now: a mutation replaces it)
    gate.reached.wait()
    began = clock.monotonic()
    granted = 0
    while clock.monotonic() - began < seconds:
        grant = box.store.rate_bucket_apply(
            channel.name, names, lambda b, now, paused: take(b, 1, now, paused)
        )
        granted += grant.granted
    history.write("take", "ok", name, f"{granted} {began} {clock.monotonic()}")
    history.close()
    box.close()


def clock_holder_main(workload: Workload, name: str, frozen_at: datetime, held: Any) -> None:
    """A test process that holds the database's clock frozen, through a lease, and is then
    SIGKILLed: no `finally`, no release."""
    box = build(workload, name)
    lease = timedelta(seconds=workload.timing.clock_lease_s if workload.timing else 30.0)
    ClockLease(box.store, lease).set(frozen_at=frozen_at)
    held.set()
    os.kill(os.getpid(), signal.SIGKILL)


def publisher_main(
    workload: Workload,
    name: str,
    customers: list[int],
    period: str,
    gate: Gate,
    *,
    started: Any = None,
) -> None:
    """Another process of the app, enqueueing the week's digests again one at a time (each a
    write that finds its key taken), from `gate.reached` until `gate.release`: whether each
    enqueue committed goes into the history. `started` (an event) is set once its first enqueue
    has ended, so a scenario can start its worker only once every publisher is at work."""
    logging.basicConfig(level=workload.log_level, format=f"{name}: %(levelname)s %(message)s")
    box = build(workload, name)
    history = HistoryWriter(Path(workload.history), name, workload.seed)
    pace = random.Random(f"{workload.seed}:{name}")
    gate.reached.wait()
    try:
        for customer in itertools.cycle(customers):
            if gate.release.is_set():
                break
            try:
                box.enqueue("weekly_digest", customer_id=customer, period=period)
                history.write("enqueue", "ok", f"customer-{customer}")
            except StoreUnavailable as exc:
                history.write("enqueue", "fail", f"customer-{customer}", str(exc)[:300])
            if started is not None:
                started.set()
            clock.sleep(pace.uniform(0.02, 0.12))  # the app's own pace between two requests
    finally:
        history.close()
        box.close()


def racer_main(
    workload: Workload, name: str, customers: list[int], period: str, start: Any
) -> None:
    """A consumer of an at-least-once broker that delivers these digests (the same keys the
    table queue and the other racers hold): all racers pass `start` together."""
    logging.basicConfig(level=workload.log_level, format=f"{name}: %(levelname)s %(message)s")
    install_plan((), None, HistoryWriter(Path(workload.history), name, workload.seed))
    box = build(workload, name)
    broker = RedeliveringTransport(copies=1, seed=workload.seed)
    for customer in customers:
        broker.publish("weekly_digest", customer_id=customer, period=period)
    consumer = box.consumer(transport=broker, name=name)
    history = HistoryWriter(Path(workload.history), name, workload.seed)
    try:
        start.wait()
        while broker.pending:
            absorbed = consumer.run_once().duplicates
            if absorbed:
                history.write("absorb", "ok", name, str(absorbed))
    finally:
        history.close()
        consumer.session.close()
        box.close()


def _stop_heartbeats() -> None:
    """This process's leases are never extended: with a pause at a point, the whole worker
    stalls as in a stop-the-world pause, and its leases run out on the shared clock."""
    from oncebox.lanes.lease_keeper import LeaseKeeper, LeaseKeeperResult  # noqa: PLC0415

    def no_heartbeat(self: LeaseKeeper) -> LeaseKeeperResult:
        return LeaseKeeperResult(tokens=0, extended=0, overdue=0)

    setattr(LeaseKeeper, "run_once", no_heartbeat)  # noqa: B010
