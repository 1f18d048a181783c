"""The workload every scenario runs — the freight app's weekly digest — and its worker processes.

A worker process is started with `spawn` (a fresh interpreter: nothing inherited but its
arguments), builds the same box as the harness, installs the fault plan's actions at named
points, and works until idle. The harness drives the one clock they all read (the database's).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from oncebox import Box, Retry, WorkerConfig, points
from oncebox.chaos import mutations
from oncebox.chaos.history import HistoryWriter
from oncebox.chaos.recording import RecordingProvider
from oncebox.examples.logistics.app import SENDER, build_box
from oncebox.jobs.periods import iso_week
from oncebox.outbox.dispatcher import DispatcherConfig
from oncebox.providers import from_url
from oncebox.queue.consumer import ConsumerConfig
from oncebox.testing import RedeliveringTransport

Action = Literal["kill", "stop", "pause", "raise"]
CHANNEL_RETRY = Retry(max_attempts=4, base_delay=timedelta(seconds=30))


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


@dataclass(frozen=True)
class PointPlan:
    """At the `nth` arrival at `point`, do `action` (`stop`: SIGSTOP this process; `pause`:
    block until the harness releases the gate)."""

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


def build(workload: Workload, worker: str) -> Box:
    """The freight box with the run's provider behind a recorder, and the run's mutations."""
    period = mutations.wrong_iso_week() if "period-%Y" in workload.mutations else iso_week
    box = build_box(
        workload.url,
        secret=workload.secret,
        tz=workload.tz,
        period=period,
        batch_size=workload.batch_size,
    )
    history = HistoryWriter(Path(workload.history), worker, workload.seed)
    box.channel(
        "email",
        provider=RecordingProvider(from_url(workload.email), history),
        sender=SENDER,
        ambiguity=workload.ambiguity,
        retry=CHANNEL_RETRY,
    )
    mutations.apply_to_store(box.store, workload.mutations)
    return box


def worker_config(lanes: Lanes) -> WorkerConfig:
    return WorkerConfig(
        until_idle=True,
        simulated_time=True,
        exit_on_hung_handler=False,
        concurrency=lanes.concurrency,
        consume=lanes.consume,
        dispatch=lanes.dispatch,
        schedule=lanes.schedule,
        sweep=lanes.sweep,
        consumer=ConsumerConfig(batch_size=lanes.batch),
        dispatcher=DispatcherConfig(batch_size=lanes.batch),
    )


@dataclass
class _Arrivals:
    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def arrive(self, point: str) -> int:
        with self.lock:
            self.counts[point] = self.counts.get(point, 0) + 1
            return self.counts[point]


def install_plan(
    plans: tuple[PointPlan, ...], gate: Gate | None, history: HistoryWriter | None = None
) -> None:
    """The fault plan's actions, and (with `history`) a record of every consumer commit and
    every fenced-off settlement: superseded leases must commit nothing (S9)."""
    arrivals = _Arrivals()
    chains: dict[str, list[points.Action]] = {}
    if history is not None:
        chains["consumer.committed"] = [lambda _n: history.write("commit", "ok", history.worker)]
        chains["consumer.lease_lost"] = [
            lambda _n: history.write("commit", "fail", history.worker, "lease superseded")
        ]
    for plan in plans:

        def act(name: str, plan: PointPlan = plan) -> None:
            if arrivals.arrive(name) != plan.nth:
                return
            if plan.action == "kill":
                points.kill(name)
            elif plan.action == "raise":
                raise RuntimeError(f"chaos: injected failure at {name}")
            assert gate is not None, "stop and pause need a gate"
            gate.reached.set()
            if plan.action == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif not gate.release.wait(120):
                raise TimeoutError(f"chaos: {name} was never released")

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
    install_plan(plans, gate, HistoryWriter(Path(workload.history), name, workload.seed))
    if not lanes.heartbeats:
        _stop_heartbeats()
    box = build(workload, name)
    try:
        box.work(config=worker_config(lanes))
    finally:
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
    from oncebox.queue.lease_keeper import LeaseKeeper, LeaseKeeperResult  # noqa: PLC0415

    def no_heartbeat(self: LeaseKeeper) -> LeaseKeeperResult:
        return LeaseKeeperResult(tokens=0, extended=0, overdue=0)

    setattr(LeaseKeeper, "run_once", no_heartbeat)  # noqa: B010
