"""Entry points for worker processes started by tests (multiprocessing, spawn)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from oncebox import Box, ConsumerConfig, JobContext
from oncebox.chaos.workload import PointPlan, install_plan
from oncebox.kernel import points
from oncebox.testing import RedeliveringTransport
from support.apps import digest_box
from support.db import record_effect


def enqueue_and_work(url: str, customers: list[int], barrier: Any, results: Any, name: str) -> None:
    """Enqueue every customer's digest, then consume until nothing is left."""
    box = digest_box(url)
    try:
        barrier.wait(30)
        created = sum(
            box.enqueue(box.registry.get("weekly_digest"), customer_id=c, period="2026-W33").created
            for c in customers
        )
        completed = duplicates = 0
        consumer = box.consumer(ConsumerConfig(batch_size=7), name=name)
        try:
            while True:
                result = consumer.run_once()
                completed += result.completed
                duplicates += result.duplicates
                if not result.leased:
                    break
        finally:
            consumer.session.close()
        results.put((name, created, completed, duplicates))
    finally:
        box.close()


def hold_key_in_handler(url: str, inside: Any, backend_pid: Any) -> None:
    """Lease the digest job and stop inside its handler, holding the uncommitted intent row,
    until this process is killed."""
    box = Box(url)

    @box.task(key="weekly-digest/customer-{customer_id}/{period}")
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        record_effect(ctx, "A")
        row = ctx.connection.execute("SELECT pg_backend_pid()").fetchone()
        backend_pid.put(row[0])
        inside.set()
        signal.pause()  # until SIGKILL

    consumer = box.consumer(ConsumerConfig(batch_size=1), name="A")
    consumer.run_once()
    os._exit(3)  # unreachable unless the handler returned


def broker_consumer(
    url: str, deliveries: list[tuple[str, str]], barrier: Any, results: Any
) -> None:
    """Consume the given (message task, args) deliveries, all at the same moment as the others."""
    box = digest_box(url)
    broker = RedeliveringTransport(copies=1)
    for _task, customer in deliveries:
        broker.publish("weekly_digest", customer_id=int(customer), period="2026-W33")
    consumer = box.consumer(ConsumerConfig(batch_size=50), transport=broker)
    try:
        barrier.wait(30)
        result = consumer.run_once()
        results.put((os.getpid(), result.completed, result.duplicates))
    finally:
        consumer.session.close()
        box.close()


def work_until_stopped(url: str, inside: Any, proceed: Any) -> None:
    """A worker in this process's main thread (so it owns SIGTERM); its first handler waits for
    the test's go-ahead, so a signal can arrive mid-batch."""
    from datetime import timedelta

    from oncebox import WorkerConfig

    box = Box(url)

    @box.task(key="step/{n}")
    def step(ctx: JobContext, n: int) -> None:
        record_effect(ctx, "ran")
        inside.set()
        proceed.wait(30)

    box.work(
        config=WorkerConfig(
            consumer=ConsumerConfig(batch_size=10, transaction_budget=timedelta(0)),
            poll_interval=timedelta(seconds=30),
        )
    )
    box.close()


def hang_in_handler(url: str, inside: Any) -> None:
    """A worker whose handler never returns; the watchdog must end the process."""
    from datetime import timedelta

    from oncebox import WorkerConfig

    box = Box(url)

    @box.task(key="hang/{n}", timeout=0.2)
    def hang(ctx: JobContext, n: int) -> None:
        inside.set()
        signal.pause()

    # the test holds the clock frozen: this worker runs on it on purpose
    box.work(config=WorkerConfig(handler_grace=timedelta(seconds=0.3), simulated_time=True))


def crash_in_handler(url: str) -> None:
    """A poison job: its handler kills the process on every attempt."""
    from oncebox import Retry, WorkerConfig

    box = Box(url)

    @box.task(key="poison/{n}", retry=Retry(max_attempts=2))
    def poison(ctx: JobContext, n: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    # the test holds the clock frozen: this worker runs on it on purpose
    box.work(config=WorkerConfig(until_idle=True, simulated_time=True))


def dispatch_and_die(url: str, provider: str, point: str) -> None:
    """A dispatcher killed (SIGKILL) at a named point of its first send."""
    from oncebox.kernel import points
    from support.outbox import mail_box

    box = mail_box(url, provider)
    points.install(point, points.kill)
    box.dispatcher().run_once()
    os._exit(3)  # not reached when the point fires


def fan_out_and_die(url: str, batch_size: int) -> None:
    """A scheduler killed (SIGKILL) between two enqueue batches of a fan-out."""
    from oncebox.kernel import points
    from support.digest_schedule import scheduled_box

    box = scheduled_box(url, batch_size=batch_size)
    points.install("scheduler.between_batches", points.kill)
    box.ticker().run_once()
    os._exit(3)


def sweep_and_die(url: str) -> None:
    """A sweeper killed (SIGKILL) after its transition, before its commit."""
    from oncebox.kernel import points
    from support.holds import holds_box

    box = holds_box(url)
    points.install("sweeper.after_transition_before_commit", points.kill)
    box.expiry_sweeper("hold-expiry").run_once()
    os._exit(3)


def enqueue_digest(url: str, customer: int) -> None:
    """Enqueue one weekly digest from a process of its own (no in-process wake-up shortcut)."""
    box = digest_box(url)
    try:
        box.enqueue(box.registry.get("weekly_digest"), customer_id=customer, period="2026-W33")
    finally:
        box.close()


def hold_clock_and_die(url: str, lease_s: float, held: Any) -> None:
    """A test process that freezes the database's clock through a lease, then is SIGKILLed:
    no `finally`, no release."""
    from datetime import UTC, datetime, timedelta

    from oncebox.kernel.clock import ClockLease
    from oncebox.store import open_store

    store = open_store(url)
    ClockLease(store, timedelta(seconds=lease_s)).set(frozen_at=datetime(2026, 8, 17, tzinfo=UTC))
    held.set()
    os.kill(os.getpid(), signal.SIGKILL)


def demo_and_die(db: str, outbox: str, point: str) -> None:
    """`oncebox demo` SIGKILLed at the first arrival at a named point: its frozen clock, its
    leases and its pending messages are left as they were."""
    from oncebox.examples.logistics import demo
    from oncebox.kernel import points

    points.install(point, points.kill)
    demo.run(demo.DemoOptions(db=db, customers=60, email=f"file://{outbox}", faults=False))
    os._exit(3)  # not reached when the point fires


def stop_in_a_lane_thread(gate: Any, lines_after: Any) -> None:
    """A worker's shape: the main thread joins a lane thread, which reaches a point planned to
    `stop` the process and then counts every line it runs after the stop (none may run before
    the harness sends SIGCONT)."""
    install_plan((PointPlan("consumer.leased", "stop", 1),), gate)

    def lane() -> None:
        points.reach("consumer.leased")
        while True:
            lines_after.value += 1  # this thread is the only writer

    thread = threading.Thread(target=lane, daemon=True)
    thread.start()
    thread.join()
