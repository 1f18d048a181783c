"""The scenarios: each runs the freight weekly digest with one family of faults, then lets the
system settle for the checker. A scenario is a script over `RunContext`; what it injects is
written to the run's faults, and scenario-specific invariants (S9, S10) are added here.

Which arrival at a point is hit, which customers a fault touches: drawn from the run's seed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

import psycopg

from oncebox.chaos.broker import publish_again
from oncebox.chaos.history import read_history
from oncebox.chaos.receiver import served_receiver
from oncebox.chaos.runner import DRAIN, RunContext, RunSettings, monday_fire
from oncebox.chaos.workload import (
    CHANNEL_RETRY,
    REPORTS_SECRET_ENV,
    SNEAKS,
    Lanes,
    PointPlan,
    Timing,
)
from oncebox.examples.logistics.app import connect
from oncebox.kernel.errors import PayloadTooLarge
from oncebox.lanes.assembly import build_resolver
from oncebox.limits.rates import Limit
from oncebox.runtime.operations import DeadFilter
from oncebox.testing import RedeliveringTransport

Store = Literal["sqlite", "postgres"]
BOTH: tuple[Store, ...] = ("sqlite", "postgres")
CONSUME = Lanes(dispatch=False, schedule=False, sweep=False)
DISPATCH = Lanes(consume=False, schedule=False, sweep=False)
CONSUME_ONLY = replace(DRAIN, dispatch=False, schedule=False, sweep=False)  # messages then wait
DISPATCH_ONLY = replace(DRAIN, consume=False, schedule=False, sweep=False)
PAST_ANY_LEASE = timedelta(hours=1)  # SQLite consumer leases outlast a transaction (~5 min)
BROKER_NAMES = {"rabbitmq": "RabbitMQ", "nats": "NATS JetStream", "sqs": "SQS"}


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    script: Callable[[RunContext], None]
    invariants: str
    provider: Literal["api", "smtp"] = "api"
    ambiguity: Literal["hold", "retry"] = "hold"
    stores: tuple[Store, ...] = BOTH
    tz: str = "UTC"
    week: tuple[int, int] = (2026, 33)
    ci: bool = True
    restarts_server: bool = False
    window: timedelta = timedelta(hours=24)  # the HTTP API's idempotency window
    timing: Timing | None = None  # on the real clock, with these leases and backoffs
    sneak: int = 0  # a customer whose handler tries to end the claim's transaction
    slots: int = 0  # > 0: the digest task runs under oncebox.Concurrency(slots)
    broker: str = ""  # "rabbitmq", "sqs", "nats": the digests' queue is that broker's (relayed)
    restarts_broker: bool = False  # a private broker of `broker`'s kind (report.PRIVATE_BROKERS)
    reports: bool = False  # the provider reports through signed webhooks (chaos/receiver.py)

    def settings(self, server: str | None, customers: int, seed: int) -> RunSettings:
        return RunSettings(
            scenario=self.name,
            server=server,
            customers=customers,
            seed=seed,
            provider=self.provider,
            ambiguity=self.ambiguity,
            tz=self.tz,
            week=self.week,
            window=self.window,
            timing=self.timing,
            sneak=self.sneak,
            slots=self.slots,
            broker=self.broker,
            reports=self.reports,
        )


# -- duplicates ------------------------------------------------------------------------------


def duplicate_publish(run: RunContext) -> None:
    """The producer publishes the fan-out's jobs again (absorbed at enqueue), and a broker
    delivers some of them twice more after they ran (absorbed at the claim)."""
    fan_out = run.fan_out()
    period = fan_out.period
    deliverable = [c for c in run.active_customers() if c != run.poison]
    some = run.rng.sample(deliverable, min(40, len(deliverable)))
    again = run.box.enqueue_many("weekly_digest", run.digest_args(some, period))
    run.absorbed += again.skipped
    run.fault(f"duplicate publish of {len(some)} jobs")
    run.work(CONSUME_ONLY)
    broker = RedeliveringTransport(copies=2, seed=run.settings.seed)
    for customer in some[:10]:
        broker.publish("weekly_digest", customer_id=customer, period=period)
    consumer = run.box.consumer(transport=broker)
    try:
        while broker.pending:
            run.absorbed += consumer.run_once().duplicates
    finally:
        consumer.session.close()
    run.fault("20 broker redeliveries of 10 finished jobs")
    run.drain()


def broker_duplicate_publish(run: RunContext) -> None:
    """A broker holds the digests' queue: 40 of the week's publishes are sent a second time
    before the jobs run, and 10 a third time after they ran. Each copy finds its job moved on
    and is acknowledged unrun."""
    run.fan_out()
    run.work(DISPATCH_ONLY)  # the relay publishes the week's jobs
    conn = connect(run.box)
    try:
        published = [
            (str(row[0]), str(row[1]))
            for row in conn.execute(
                "SELECT payload::text, token FROM oncebox_outbox WHERE channel LIKE '~%' "
                "ORDER BY id"
            ).fetchall()
        ]
    finally:
        conn.close()
    some = run.rng.sample(published, min(40, len(published)))
    workload = run.workload
    assert workload.broker is not None
    publish_again(workload.broker, workload.digest_queue, some)
    run.fault(f"{len(some)} publishes sent twice before their jobs ran")
    run.work(CONSUME_ONLY)
    publish_again(workload.broker, workload.digest_queue, some[:10])
    run.fault("10 publishes sent a third time after their jobs ran")
    run.drain()


def concurrent_consumers(run: RunContext) -> None:
    """Three processes consume broker deliveries of the same keys while a fourth works the
    table queue: every claim of a key races in the database, one wins."""
    fan_out = run.fan_out()
    keys = [c for c in run.active_customers() if c != run.poison][:25]
    start = run.barrier(3)  # the racers start claiming together
    racers = [run.spawn_racer(f"racer-{i}", keys, fan_out.period, start) for i in range(3)]
    table = run.spawn("table", lanes=CONSUME)
    with run.observing():
        for racer in racers:
            run.join(racer)
        run.join(table)
    run.fault(f"3 processes x {len(keys)} deliveries of the same keys, racing the table queue")
    run.drain()


# -- crashes ---------------------------------------------------------------------------------


def kill_at(point: str, lanes: Lanes, *, broker: bool = False) -> Callable[[RunContext], None]:
    """SIGKILL a worker at `point`. On a broker-held queue (`broker`) a consumer point is met
    once the relay has published the week's jobs, and a dispatcher point is the relay's own:
    between the enqueue's commit and the publish, or between the broker's confirm and its
    record (then the publish is sent again: a duplicate the consumer finds stale)."""

    def script(run: RunContext) -> None:
        run.fan_out()
        if point.startswith("dispatcher."):
            run.work(CONSUME_ONLY)  # messages waiting for a sender (a broker's: its jobs')
        elif broker:
            run.work(DISPATCH_ONLY)  # the relay publishes the week's jobs
        nth = run.rng.randint(1, 2)  # batches of 20: a kill in the first or a later batch
        victim = run.spawn(f"victim-{point}", (PointPlan(point, "kill", nth),), lanes=lanes)
        with run.observing():
            killed = run.killed(victim)
        if killed:
            run.fault(f"SIGKILL at {point} (arrival {nth})")
        else:
            run.violation(
                "harness",
                point,
                f"the worker was to be killed at arrival {nth} of {point} but exited "
                f"{victim.exitcode}",
            )
        run.advance(PAST_ANY_LEASE)
        run.drain()

    return script


def kill_scheduler(run: RunContext) -> None:
    """SIGKILL between fan-out batches; another scheduler takes the period over after the lease
    and enqueues only the customers still missing."""
    _scheduler_dies_half_way(run)
    run.advance(timedelta(minutes=10))  # past the fan-out's lease, within the schedule's grace
    run.drain()


def _scheduler_dies_half_way(run: RunContext) -> datetime:
    """The week's scheduler SIGKILLed between two fan-out batches; returns the fire."""
    fire = monday_fire(*run.settings.week, tz=run.settings.tz)
    run.set_clock(fire + timedelta(seconds=30))
    run.periods.append(run.label(fire))
    victim = run.spawn(
        "victim-scheduler",
        (PointPlan("scheduler.between_batches", "kill", 1),),
        lanes=Lanes(consume=False, dispatch=False, sweep=False),
        workload=replace(run.workload, batch_size=max(10, run.settings.customers // 5)),
    )
    if run.killed(victim):
        run.fault("SIGKILL between fan-out batches")
    else:
        run.violation("harness", "scheduler", f"scheduler exited {victim.exitcode}, not killed")
    return fire


def kill_sweeper(run: RunContext) -> None:
    """SIGKILL after the holds were marked expired, before that commit: no hold is expired
    without its notice, none gets two."""
    run.fan_out()
    victim = run.spawn(
        "victim-sweeper",
        (PointPlan("sweeper.after_transition_before_commit", "kill", 1),),
        lanes=Lanes(consume=False, dispatch=False, schedule=False),
    )
    if run.killed(victim):
        run.fault("SIGKILL inside the sweeper's transaction")
    else:
        run.violation("harness", "sweeper", f"sweeper exited {victim.exitcode}, not killed")
    run.drain()


# -- leases ----------------------------------------------------------------------------------


def slow_consumer_past_lease(run: RunContext) -> None:
    """Worker A leases a batch and stalls; its lease runs out; worker B leases the same jobs and
    stalls too; A wakes: its settlement must be fenced off — A commits nothing (S9) — and B
    completes them."""
    run.fan_out()
    first, second = run.gate(), run.gate()
    stalled = PointPlan("consumer.leased", "pause", 1)
    # one batch each: A's jobs are exactly B's; A's heartbeats stall with it
    everything = replace(CONSUME, batch=1000)
    slow_lanes = replace(everything, heartbeats=False)
    slow = run.spawn("slow", (stalled,), first, lanes=slow_lanes)
    run.wait(first, "the slow worker to lease a batch")
    run.advance(PAST_ANY_LEASE)
    taker = run.spawn("taker", (stalled,), second, lanes=everything)
    run.wait(second, "the second worker to lease the expired batch")
    first.release.set()
    run.join(slow)
    second.release.set()
    run.join(taker)
    run.fault("a worker stalled past its lease while another took its jobs over")
    _superseded_committed_nothing(run, "slow")
    run.drain()


def sigstop_past_lease(run: RunContext) -> None:
    """SIGSTOP a worker that holds a lease, let the lease run out and the jobs be done by
    others, then SIGCONT it: it must commit nothing."""
    run.fan_out()
    gate = run.gate()
    frozen = run.spawn(
        "frozen",
        (PointPlan("consumer.leased", "stop", 1),),
        gate,
        lanes=replace(CONSUME, batch=1000),
    )
    run.wait(gate, "the worker to lease a batch and stop")
    run.advance(PAST_ANY_LEASE)
    run.drain()
    frozen_pid = frozen.pid
    assert frozen_pid is not None
    os.kill(frozen_pid, signal.SIGCONT)
    run.join(frozen)
    run.fault("SIGSTOP past the lease, SIGCONT after the jobs were done")
    _superseded_committed_nothing(run, "frozen")
    run.drain()


def _superseded_committed_nothing(run: RunContext, worker: str) -> None:
    commits = [e for e in read_history(run.folder) if e.op == "commit" and e.worker == worker]
    if any(e.phase == "ok" for e in commits):
        run.violation(
            "S9 superseded leases commit nothing",
            worker,
            f"worker {worker} committed after its lease was superseded "
            f"({sum(e.phase == 'ok' for e in commits)} commit(s))",
        )


# -- redrive, replay, periods ----------------------------------------------------------------


def redrive_after_hours(run: RunContext) -> None:
    """The provider is down (503) for the whole retry budget of every digest; an operator
    redrives half the dead letters six minutes later and the rest six hours later: the same key
    and message, delivered once (S10)."""
    run.fan_out()
    run.work(CONSUME_ONLY)
    waiting = run.count("SELECT count(*) FROM oncebox_outbox WHERE state = 'pending'")
    run.provider.script(*["503"] * waiting * CHANNEL_RETRY.max_attempts)
    run.fault(f"503 for every attempt of {waiting} messages")
    run.drain()
    dead = run.box.dead_letters(DeadFilter(kind="delivery"))
    before = {row.id: str(row.key) for row in dead}
    if not dead:  # (hold notices written meanwhile take some of the 503s)
        run.violation("harness", "redrive", f"none of {waiting} messages died")
    for after, limit in ((timedelta(minutes=6), len(dead) // 2), (timedelta(hours=6), len(dead))):
        run.advance(after)
        replayed = run.box.replay_dead(
            DeadFilter(kind="delivery", limit=max(limit, 1)),
            reason="chaos: the provider recovered",
            per_second=1000,
            sleep=lambda _s: None,
        )
        run.fault(f"{len(replayed)} dead letters redriven after {after}")
        run.drain()
    for row_id, key in before.items():
        now = run.box.store.outbox_get(row_id)
        if now is None or now.key != key or now.state != "sent":
            run.violation(
                "S10 replays keep the key",
                key,
                f"message {row_id} after the redrive: {now.state if now else 'gone'}, "
                f"key {now.key if now else None}",
            )


def manual_rerun(run: RunContext) -> None:
    """An operator re-runs the week by hand, twice, after it was delivered: nothing new."""
    fan_out = run.fan_out()
    run.drain()
    for _ in range(2):
        again = run.box.run_schedule("weekly-digest", fan_out.period)
        run.fault(f"manual re-run of {fan_out.period}: {again.enqueued} enqueued")
        if again.enqueued:
            run.violation(
                "S2 one intent per eligible key",
                f"weekly-digest/{fan_out.period}",
                f"a manual re-run enqueued {again.enqueued} jobs for a delivered week",
            )
    run.drain()


def weeks_across(*weeks: tuple[int, int]) -> Callable[[RunContext], None]:
    """The clock walks over several weekly fires (an ISO-year boundary, a DST change)."""

    def script(run: RunContext) -> None:
        for year, week in weeks:
            run.fan_out(monday_fire(year, week, tz=run.settings.tz))
            run.drain()
        run.fault(f"clock advanced over {len(weeks)} weekly fires")

    return script


# -- database and provider faults ----------------------------------------------------------------


def connection_drops(run: RunContext) -> None:
    """The server ends a worker's connection in the middle of its consumer transaction
    (pg_terminate_backend): the transaction rolls back; the worker reconnects; nothing lost."""
    run.fan_out()
    gate = run.gate()
    victim = run.spawn(
        "dropped", (PointPlan("consumer.after_claim_insert", "pause", 1),), gate, lanes=CONSUME
    )
    run.wait(gate, "the worker to be inside its transaction")
    with psycopg.connect(run.url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name LIKE %s",
            (f"oncebox %:{victim.pid}:%",),
        ).fetchone()
    gate.release.set()
    run.join(victim)
    terminated = int(ended[0]) if ended else 0
    run.fault(f"pg_terminate_backend of {terminated} worker connection(s)")
    if not terminated:
        run.violation("harness", "connection-drops", "no connection of the worker was found")
    run.advance(PAST_ANY_LEASE)
    run.drain()


def broker_restart(run: RunContext) -> None:
    """The broker restarts while a worker has committed a batch and not yet acknowledged it: the
    acknowledgements are lost with the connection, the worker reconnects, the broker delivers
    the batch again after its restart (RabbitMQ's quorum queue, JetStream's file-stored stream
    and durable consumer kept every message and what was unacknowledged) and each copy finds its
    job done. The broker is the run's own (private_broker.py, private_nats.py)."""
    run.fan_out()
    run.work(DISPATCH_ONLY)  # the relay publishes the week's jobs
    gate = run.gate()
    victim = run.spawn(
        "restarted", (PointPlan("consumer.committed", "pause", 1),), gate, lanes=CONSUME
    )
    run.wait(gate, "the worker to have committed its first batch")
    run.restart_broker()
    gate.release.set()
    code = run.join(victim)
    broker = BROKER_NAMES[run.settings.broker]
    run.fault(
        f"{broker} restarted between a commit and its acknowledgements (worker exited {code})"
    )
    run.drain()


def server_restart(run: RunContext) -> None:
    """The PostgreSQL server restarts while a worker is inside its consumer transaction (and
    every pooled connection dies): the transaction rolls back, the workers reconnect, the week
    is delivered once. The server is the run's own (see private_server.py)."""
    run.fan_out()
    gate = run.gate()
    victim = run.spawn(
        "restarted", (PointPlan("consumer.after_claim_insert", "pause", 1),), gate, lanes=CONSUME
    )
    run.wait(gate, "the worker to be inside its transaction")
    run.restart_server()
    gate.release.set()
    code = run.join(victim)
    run.fault(f"PostgreSQL restarted mid-transaction (the worker then exited {code})")
    run.reconnect()
    survivor = run.spawn("after-restart")
    run.join(survivor)
    run.advance(PAST_ANY_LEASE)
    run.drain()


def resend_past_window(run: RunContext) -> None:
    """The API takes four digests and answers only after the client gave up (unknown
    outcomes); the resends fall due after its idempotency window has passed. A resend then would
    be a second copy — the API has forgotten the key — so the rows must be held `ambiguous`."""
    run.fan_out()
    run.work(CONSUME_ONLY)
    run.provider.script(*["accept-then-timeout:2"] * 4)
    run.work(DISPATCH_ONLY)  # four unknown outcomes; their resends wait out a backoff
    window = run.settings.window
    run.advance(window + timedelta(minutes=10))
    run.fault(
        f"4 sends answered after the client's timeout; the clock then passed the {window} window"
    )
    run.drain()


def lost_acks_reported(run: RunContext) -> None:
    """As resend-past-window, with the provider reporting what it took: its signed webhooks
    arrive late, twice, in reverse order, every third first with a bad signature — some before
    the dispatcher has written down that it does not know. Every held send must be settled
    `sent` from its report (H1) and none sent twice (S5)."""
    api = run.provider.api
    assert api is not None, "an HTTP API scenario"
    with served_receiver(run.box) as base:
        api.send_webhooks(
            f"{base}/email",
            os.environ[REPORTS_SECRET_ENV],
            delay=0.3,
            duplicates=1,
            reorder=True,
            bad_signature_every=3,
        )
        run.fan_out()
        run.work(CONSUME_ONLY)
        lost = min(3, len(run.active_customers()))
        run.provider.script(*["accept-then-timeout:2"] * lost)
        run.work(DISPATCH_ONLY)
        window = run.settings.window
        run.advance(window + timedelta(minutes=10))
        run.fault(
            f"{lost} sends answered after the client's timeout, past the {window} window; the "
            "provider's webhooks late, doubled, reordered, every third first badly signed"
        )
        run.drain()
        if not api.wait_webhooks(timeout=120):
            run.violation("H1 held sends settled by reports", "webhooks", "events still queued")
    build_resolver(run.box.runtime, run.box.channels).run_once()  # the resolver lane's round
    held = run.box.store.outbox_count_by_state()["ambiguous"]
    if held:
        run.violation(
            "H1 held sends settled by reports",
            run.settings.scenario,
            f"{held} send(s) still held although the provider reported each one taken",
        )


def provider_storm(run: RunContext) -> None:
    """429 with Retry-After, 5xx, accepted-then-reset and accepted-then-timed-out answers."""
    run.fan_out()
    run.work(CONSUME_ONLY)
    actions = ["429:30", "500", "accept-then-reset", "503:5", "accept-then-timeout:2", "429:1"]
    run.provider.script(*actions)
    run.fault(f"provider answers {', '.join(actions)}")
    run.drain()


def smtp_lost_acks(run: RunContext) -> None:
    """An SMTP server takes messages and drops the connection before its 250 (the lost
    acknowledgement), answers 250 only after the client gave up (accept-then-timeout), greylists
    (451) and throttles (421)."""
    run.fan_out()
    run.work(CONSUME_ONLY)
    actions = [
        "drop",
        "451 4.7.1 greylisted",
        "accept-then-timeout:2",
        "drop",
        "421 4.3.2 slow down",
    ]
    run.provider.script(*actions)
    run.fault(
        "SMTP: two lost acknowledgements, one 250 after the client's timeout, a 451 and a 421"
    )
    run.drain()


def poison_and_oversized(run: RunContext) -> None:
    """The poison customer (an address no provider accepts), an oversized message refused at
    enqueue, and a broker delivery whose arguments are wrong: clear errors, nothing lost."""
    run.fan_out()
    try:
        run.box.enqueue("weekly_digest", customer_id=1, period="2026-W33" + "x" * 300_000)
        run.violation("G2 oversized refused", "enqueue", "a 300 kB argument was accepted")
    except PayloadTooLarge:
        run.fault("an oversized enqueue, refused")
    broker = RedeliveringTransport(copies=1, seed=run.settings.seed)
    broker.publish("weekly_digest", customer_id="not-a-number", period=run.periods[-1])
    consumer = run.box.consumer(transport=broker)
    try:
        while broker.pending:
            consumer.run_once()
    finally:
        consumer.session.close()
    if not broker.acks or broker.acks[0][1] != "dead":
        run.violation("G1 malformed messages die", "broker", f"acks {broker.acks}")
    run.fault("a broker delivery with a malformed customer id")
    run.drain()


# -- refused and ended transactions, interrupted fan-outs ----------------------------------------


def commit_refused(run: RunContext) -> None:
    """The database refuses one customer's digest at the end of its transaction — a deferred
    constraint checked at COMMIT (PostgreSQL), a trigger on the outbox row (SQLite) — while it
    shares batches with everyone else's: that job must end dead with the database's reason and
    every other digest be delivered, not the batch given back and leased again for ever."""
    refused = [c for c in run.active_customers() if c != run.poison][2]
    conn = connect(run.box)
    try:
        if run.dialect == "postgres":
            conn.execute("CREATE TABLE freight_allowed (customer_id bigint PRIMARY KEY)")
            conn.execute(
                "INSERT INTO freight_allowed SELECT id FROM freight_customers WHERE id <> %s",
                (refused,),
            )
            conn.execute(
                "ALTER TABLE freight_digests ADD CONSTRAINT digest_allowed FOREIGN KEY "
                "(customer_id) REFERENCES freight_allowed DEFERRABLE INITIALLY DEFERRED"
            )
        else:
            conn.execute(
                "CREATE TRIGGER refuse_one BEFORE INSERT ON oncebox_outbox WHEN NEW.intent_key "
                f"LIKE 'weekly-digest/customer-{refused}/%' BEGIN "
                "SELECT RAISE(ABORT, 'refused by the database'); END"
            )
        conn.commit()
    finally:
        conn.close()
    run.fault(f"the database refuses customer {refused}'s digest at the end of its transaction")
    run.fan_out()
    run.drain()


def guard_bypass(run: RunContext) -> None:
    """One customer's handler tries to commit the claim's transaction behind a comment. The
    guard must refuse it (that job ends dead), and nothing of the batches it shared may be
    settled on the strength of a claim alone: every other digest is rendered and delivered."""
    run.fan_out()
    run.drain()
    run.fault(f"customer {run.workload.sneak}'s handler runs {SNEAKS[run.dialect]!r}")


def scheduler_replaced_after_next_fire(run: RunContext) -> None:
    """The scheduler is SIGKILLed between two fan-out batches, and nobody takes over until the
    next Monday's fire has passed: the interrupted week must still be fanned out in full — its
    run is resumed before the catch-up policy (`latest`) picks the new week."""
    fire = _scheduler_dies_half_way(run)
    following = fire + timedelta(weeks=1)
    run.set_clock(following + timedelta(minutes=10))
    run.periods.append(run.label(following))
    run.fault("no scheduler until 10 minutes after the next Monday's fire")
    run.drain()


# -- the real clock ----------------------------------------------------------------------------

REAL = Timing()


def real_clock_crashes(run: RunContext) -> None:
    """No test clock at all: a consumer SIGKILLed inside its transaction and a dispatcher
    SIGKILLed between the provider's acceptance and its record, each leaving its leases behind.
    Once they are dead, every eligible key must reach a visible state within the bound their
    leases, the rescuer and the backoffs imply — measured on the real clock."""
    run.fan_out_now()
    consumer = run.spawn(
        "victim-consumer", (PointPlan("consumer.after_claim_insert", "kill", 1),), lanes=CONSUME
    )
    dispatcher = run.spawn(
        "victim-dispatcher",
        (PointPlan("dispatcher.after_provider_accept_before_record", "kill", 1),),
    )
    killed = [
        name for name, p in (("consumer", consumer), ("dispatcher", dispatcher)) if run.killed(p)
    ]
    run.fault(f"SIGKILL of the {' and the '.join(killed)} holding their leases (real clock)")
    run.settle_on_real_clock(("job_lease", "dispatcher_lease", "backoff"))


def store_outage_dispatch(run: RunContext) -> None:
    """The store goes away in the middle of a dispatcher's round, after the provider took
    messages and before their outcomes are recorded — on SQLite the disk fills up for a second,
    on PostgreSQL the run's own server restarts. The dispatcher must record what it learned, and
    give back what it did not send, as soon as the store answers: its lease here is a minute,
    and the bound holds no lease term."""
    run.fan_out_now()
    run.work(CONSUME_ONLY)  # the week's messages wait for a sender
    accepted = PointPlan("dispatcher.after_provider_accept_before_record", "pause", 2)
    if run.dialect == "sqlite":
        gate = run.gate()
        run.spawn("victim-dispatcher", (replace(accepted, action="full"),), gate, lanes=DISPATCH)
        # Wait for the fault: settling workers started at once could send every message before
        # the victim has started, and the run would pass without its outage.
        run.wait(gate, "the dispatcher to have sends to record")
        run.fault(
            f"the disk full for {run.settings.timing and run.settings.timing.outage_s:g} s "
            "between the provider's acceptance and the record (SQLite: database or disk is full)"
        )
    else:
        gate = run.gate()
        run.spawn("victim-dispatcher", (accepted,), gate, lanes=DISPATCH)
        run.wait(gate, "the dispatcher to have sends to record")
        run.restart_server()
        run.reconnect()
        gate.release.set()
        run.fault("the run's PostgreSQL server restarted between acceptance and record")
    run.settle_on_real_clock(("outage", "backoff"))


def clock_holder_killed(run: RunContext) -> None:
    """A test process froze the database's clock and was SIGKILLed while it held it. Workers
    must refuse that clock while its owner might be alive, and run on real time once its lease
    has lapsed: every eligible key visible within the bound, which has a term for the lease."""
    run.fan_out_now()
    held = run.event()
    holder = run.spawn_clock_holder(run.now() - timedelta(hours=1), held)
    if run.killed(holder) and held.is_set():
        run.fault("a process that held the database's clock frozen was SIGKILLed")
    else:
        run.violation("harness", "clock-holder", f"the holder exited {holder.exitcode}")
    run.settle_on_real_clock(("clock", "backoff"))


def rate_limit_contention(run: RunContext) -> None:
    """Five processes take the email channel's tokens as fast as its bucket answers, for two
    seconds of real time, contending for its lock — as many dispatchers sharing a limit do.
    Together they must be granted no more than the bucket allows (R1): its capacity plus its
    rate times the time they took (and one for the edges). Then the week is delivered under
    that limit."""
    run.fan_out_now()
    run.work(CONSUME_ONLY)
    timing = run.settings.timing
    assert timing is not None
    limit = Limit.parse(timing.limits[0])
    gate = run.gate()
    takers = [run.spawn_taker(f"taker-{i}", 2.0, gate) for i in range(5)]
    gate.reached.set()
    for taker in takers:
        run.join(taker)
    takes = [e.detail.split() for e in read_history(run.folder) if e.op == "take"]
    granted = sum(int(t[0]) for t in takes)
    span = max((float(t[2]) for t in takes), default=0.0) - min(
        (float(t[1]) for t in takes), default=0.0
    )
    allowed = limit.count + limit.refill_per_s * span + 1
    run.fault(f"5 processes took {limit.name} tokens as fast as they could: {granted} granted")
    if granted > allowed:
        run.violation(
            "R1 the rate limit holds",
            f"channel email {limit.name}",
            f"{granted} tokens granted in {span:.2f} s (at most {allowed:.1f})",
        )
    # the week's messages are then sent at the channel's rate: that much more time
    pending = run.count("SELECT count(*) FROM oncebox_outbox WHERE state <> 'sent'")
    run.settle_on_real_clock(("pause", "backoff"), extra_s=pending / limit.refill_per_s)


def sqlite_writer_contention(run: RunContext) -> None:
    """While a worker drains digests whose handlers take 50 to 150 ms, four other processes of
    the app publish the week again, one enqueue at a time, with a busy timeout of two seconds.
    Every one of those enqueues must commit (E1): the worker takes SQLite's write lock in turns,
    not for as long as it can."""
    fan_out = run.fan_out_now()
    customers = [c for c in run.active_customers() if c != run.poison]
    publishing = run.gate()  # reached: start publishing; release: stop
    started = [run.event() for _ in range(4)]
    publishers = [
        run.spawn_publisher(
            f"publisher-{i}", customers[i::4], fan_out.period, publishing, started[i]
        )
        for i in range(4)
    ]
    publishing.reached.set()
    for i, event in enumerate(started):  # every publisher at work before the worker's first
        if not event.wait(120):  # batch, however slowly a loaded machine starts processes
            raise RuntimeError(f"publisher-{i} made no enqueue within 120 s")
    worker = run.spawn("drainer", lanes=CONSUME)
    run.join(worker)
    publishing.release.set()
    for publisher in publishers:
        run.join(publisher)
    failed = [e for e in read_history(run.folder) if e.op == "enqueue" and e.phase == "fail"]
    tried = [e for e in read_history(run.folder) if e.op == "enqueue"]
    run.fault(f"4 processes made {len(tried)} enqueues while a worker drained")
    for event in failed[:5]:
        run.violation("E1 every enqueue commits", event.key, f"{event.worker}: {event.detail}")
    run.settle_on_real_clock(("backoff",))


def soak(run: RunContext) -> None:
    """Worker processes SIGKILLed at random points for a whole run, until the week settles."""
    crash_points = [
        "consumer.after_claim_insert",
        "consumer.after_handler_before_commit",
        "dispatcher.after_lease",
        "dispatcher.after_provider_accept_before_record",
    ]
    run.fan_out()
    for round_number in range(12):
        plans = tuple(
            PointPlan(point, "kill", run.rng.randint(1, 6))
            for point in run.rng.sample(crash_points, 2)
        )
        workers = [run.spawn(f"soak-{round_number}-{i}", plans) for i in range(2)]
        killed = sum(run.killed(worker) for worker in workers)
        run.fault(f"round {round_number}: {killed} of 2 workers killed")
        run.advance(PAST_ANY_LEASE)
    run.drain()


def _crash_scenarios() -> list[Scenario]:
    found = []
    plans: tuple[tuple[str, Lanes, Literal["api", "smtp"], Literal["hold", "retry"]], ...] = (
        ("consumer.leased", CONSUME, "api", "hold"),
        ("consumer.before_transaction", CONSUME, "api", "hold"),
        ("consumer.after_claim_insert", CONSUME, "api", "hold"),
        ("consumer.before_handler", CONSUME, "api", "hold"),
        ("consumer.after_handler_before_commit", CONSUME, "api", "hold"),
        # committed, not yet acknowledged to the transport: the redelivery is absorbed
        ("consumer.committed", CONSUME, "api", "hold"),
        ("dispatcher.after_lease", DISPATCH, "api", "hold"),
        ("dispatcher.after_provider_accept_before_record", DISPATCH, "api", "hold"),
        ("dispatcher.after_sending_marker", DISPATCH, "smtp", "hold"),
    )
    for point, lanes, provider, ambiguity in plans:
        found.append(
            Scenario(
                f"kill-{point}",
                f"SIGKILL at {point}",
                kill_at(point, lanes),
                "S1-S8",
                provider=provider,
                ambiguity=ambiguity,
            )
        )
    point = "consumer.before_handler"
    found.append(
        Scenario(
            f"kill-{point}-limited",
            "SIGKILL inside a handler of a task under Concurrency(2): the slot comes back when "
            "the rescuer ends the lease",
            kill_at(point, CONSUME),
            "S1-S8",
            slots=2,
        )
    )
    broker_plans: tuple[tuple[str, Lanes, str], ...] = (
        ("consumer.after_handler_before_commit", CONSUME, "before its commit"),
        ("consumer.committed", CONSUME, "between its commit and the broker's acknowledgement"),
        ("dispatcher.after_lease", DISPATCH, "the relay, between the enqueue and the publish"),
        (
            "dispatcher.after_provider_accept_before_record",
            DISPATCH,
            "the relay, after the broker's confirm and before its record: published again",
        ),
    )
    for prefix, kind in (("broker", "rabbitmq"), ("sqs", "sqs"), ("nats", "nats")):
        for point, lanes, where in broker_plans:
            found.append(
                Scenario(
                    f"{prefix}-kill-{point}",
                    f"{BROKER_NAMES[kind]} holds the digests' queue: SIGKILL {where}",
                    kill_at(point, lanes, broker=True),
                    "S1-S8, B1",
                    stores=("postgres",),
                    broker=kind,
                )
            )
    policies: tuple[Literal["hold", "retry"], ...] = ("hold", "retry")
    for policy in policies:
        point = "dispatcher.after_provider_accept_before_record"
        found.append(
            Scenario(
                f"kill-{point}-smtp-{policy}",
                f"SIGKILL after an SMTP server accepted, before the record ({policy})",
                kill_at(point, DISPATCH),
                "S6" if policy == "hold" else "S7",
                provider="smtp",
                ambiguity=policy,
            )
        )
    return found


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario(
            "duplicate-publish",
            "duplicate publish and broker redeliveries",
            duplicate_publish,
            "S1-S5",
        ),
        Scenario(
            "broker-duplicate-publish",
            "RabbitMQ holds the digests' queue: publishes sent twice, and again after the run",
            broker_duplicate_publish,
            "S1-S5, B1",
            stores=("postgres",),
            broker="rabbitmq",
        ),
        Scenario(
            "nats-duplicate-publish",
            "NATS JetStream holds the digests' queue: publishes sent twice, and again after the "
            "run (the stream drops copies within its duplicate window; the rows, the rest)",
            broker_duplicate_publish,
            "S1-S5, B1",
            stores=("postgres",),
            broker="nats",
        ),
        Scenario(
            "sqs-duplicate-publish",
            "SQS holds the digests' queue: publishes sent twice, and again after the run",
            broker_duplicate_publish,
            "S1-S5, B1",
            stores=("postgres",),
            broker="sqs",
        ),
        Scenario(
            "concurrent-consumers",
            "processes racing to claim the same keys",
            concurrent_consumers,
            "S1, S3",
        ),
        *_crash_scenarios(),
        Scenario(
            "kill-scheduler.between_batches",
            "SIGKILL between fan-out batches",
            kill_scheduler,
            "S2, S4",
        ),
        Scenario(
            "kill-sweeper.after_transition_before_commit",
            "SIGKILL inside the hold sweeper's transaction",
            kill_sweeper,
            "S3, S4",
        ),
        Scenario(
            "slow-consumer-past-lease",
            "a stalled worker wakes after its jobs were taken over",
            slow_consumer_past_lease,
            "S9",
        ),
        Scenario(
            "sigstop-past-lease",
            "SIGSTOP past the lease, SIGCONT after the jobs were done",
            sigstop_past_lease,
            "S9",
            # a stopped SQLite process may be stopped inside a write (its heartbeat), and then
            # holds the only write lock: every writer waits, as documented; the SQLite variant
            # of this fault is slow-consumer-past-lease, paused where no lock is held
            stores=("postgres",),
        ),
        Scenario(
            "redrive-after-hours",
            "dead letters redriven after 6 minutes and after 6 hours",
            redrive_after_hours,
            "S8, S10",
        ),
        Scenario("manual-rerun", "a delivered week re-run by hand", manual_rerun, "S2"),
        Scenario(
            "iso-week-boundary",
            "weekly fires across the ISO-year boundary (2026-W01 starts 2025-12-29)",
            weeks_across((2025, 52), (2026, 1), (2026, 2)),
            "P1",
            week=(2025, 52),
        ),
        Scenario(
            "dst-change",
            "weekly fires in Europe/Berlin across the spring and autumn DST changes",
            weeks_across((2026, 13), (2026, 14), (2026, 43), (2026, 44)),
            "P1",
            tz="Europe/Berlin",
            week=(2026, 13),
        ),
        Scenario(
            "connection-drops",
            "pg_terminate_backend inside a consumer transaction",
            connection_drops,
            "S1-S4",
            stores=("postgres",),
        ),
        Scenario(
            "broker-restart",
            "RabbitMQ restarted between a commit and its acknowledgements",
            broker_restart,
            "S1-S8, B1",
            stores=("postgres",),
            ci=False,
            broker="rabbitmq",
            restarts_broker=True,
        ),
        Scenario(
            "nats-restart",
            "NATS JetStream restarted between a commit and its acknowledgements",
            broker_restart,
            "S1-S8, B1",
            stores=("postgres",),
            ci=False,
            broker="nats",
            restarts_broker=True,
        ),
        Scenario(
            "server-restart",
            "the PostgreSQL server restarted mid-transaction",
            server_restart,
            "S1-S4",
            stores=("postgres",),
            ci=False,
            restarts_server=True,
        ),
        Scenario(
            "provider-storm",
            "429s, 5xx, accepted-then-reset, accepted-then-timed-out",
            provider_storm,
            "S4, S5",
        ),
        Scenario(
            "resend-past-window",
            "unknown outcomes whose resends fall due past the API's idempotency window",
            resend_past_window,
            "S5, L2",
            window=timedelta(hours=1),
        ),
        Scenario(
            "lost-acks-reported",
            "lost acknowledgements past the API's window, each reported taken by a signed "
            "webhook (late, doubled, reordered, some badly signed): all settled, none resent",
            lost_acks_reported,
            "S5, H1",
            window=timedelta(hours=1),
            reports=True,
        ),
        Scenario(
            "smtp-lost-acks-hold",
            "SMTP lost acknowledgements under the hold policy",
            smtp_lost_acks,
            "S6",
            provider="smtp",
        ),
        Scenario(
            "smtp-lost-acks-retry",
            "SMTP lost acknowledgements under the retry policy",
            smtp_lost_acks,
            "S7",
            provider="smtp",
            ambiguity="retry",
        ),
        Scenario(
            "poison-and-oversized",
            "poison, oversized and malformed messages",
            poison_and_oversized,
            "S4, S8",
        ),
        Scenario(
            "commit-refused",
            "the database refuses one digest at COMMIT, inside shared batches",
            commit_refused,
            "L1, L2, S4",
        ),
        Scenario(
            "guard-bypass",
            "a handler commits the claim's transaction behind a comment",
            guard_bypass,
            "S3, L2",
            sneak=3,
        ),
        Scenario(
            "scheduler-replaced-after-next-fire",
            "a scheduler killed mid-fan-out, replaced only after the next fire",
            scheduler_replaced_after_next_fire,
            "S4, L2, P1",
        ),
        Scenario(
            "real-clock-crashes",
            "SIGKILLed consumer and dispatcher, then settling on the real clock",
            real_clock_crashes,
            "L3",
            timing=REAL,
        ),
        Scenario(
            "store-outage-dispatch",
            "the store away mid-dispatch: a full disk (SQLite), a restart (PostgreSQL)",
            store_outage_dispatch,
            "L3, S5",
            timing=replace(REAL, dispatcher_lease_s=60.0),
            restarts_server=True,
        ),
        Scenario(
            "clock-holder-killed",
            "a process holding a frozen test clock SIGKILLed, then workers on real time",
            clock_holder_killed,
            "L3",
            timing=replace(REAL, clock_lease_s=4.0),  # outlives a worker's start: refused first
        ),
        Scenario(
            "rate-limit-contention",
            "five processes contending for a 5/s channel's bucket on the real clock",
            rate_limit_contention,
            "R1",
            timing=replace(REAL, limits=("5/s",)),
        ),
        Scenario(
            "sqlite-writer-contention",
            "four processes enqueueing while a worker drains 50-150 ms handlers (SQLite)",
            sqlite_writer_contention,
            "E1",
            timing=replace(REAL, busy_timeout_s=2.0, handler_s=(0.05, 0.15)),
            stores=("sqlite",),
        ),
        Scenario("soak", "random SIGKILLs for a whole run", soak, "S1-S8", ci=False),
    ]
}
