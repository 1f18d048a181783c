"""A queue a broker holds (in one world of two, as every part but the notices): the real broker
lanes (`brokers/`) over the in-memory broker (`sim/broker.py`), which redelivers, reorders,
counts deliveries and sets aside past its limit.

- queue `brokered`, held by `amqp://sim/?max_deliveries=3` (`Runtime.wire_for` is the sim
  broker's); task `ship(n)`, keyed `ship/{n}`: its handler returns, fails (a retry), or — for
  the poison keys, `n` ending in 9 — takes its worker down, every time (its broker gives it up
  after three deliveries, and the sweep makes it a dead letter);
- actors: `publish` (SQLite: `publish_unrecorded`, keys `ship/0`..`ship/2`, and now and then
  `ship/9`; PostgreSQL: that or, half the time, an enqueue — keys `ship/10`..`ship/12` and
  `ship/19` — whose `relayed` job the world's dispatchers publish through the relay:
  migration 0016), `broker-1` and `broker-2` (two racing consumer lanes on
  `BrokerTransport`; on PostgreSQL a lane's worker is told to stop before one transaction in
  four, faults or not, as a deploy's SIGTERM: it hands back unrun what its batch has not
  started, closes, and a new one starts in its place — SQLite's worlds keep their seeds, the
  mutation of that hand-back being pinned on PostgreSQL) and `given-up` (the sweep,
  `lanes/given_up.py`). The world's rescuer
  hands a replayed job of the queue back to the relay (PostgreSQL), and the world's table
  consumers leave the queue alone, as a worker does. Once faults stop, `broker-1` and the
  sweep run on. On PostgreSQL also `leg(route, n)`, ordered by `route`, and its enqueuers,
  which run their rounds without a pause: `enqueue-legs` (a planner: the next leg of each
  route in one batch), `legs-in-tx` (a booking: the next one to three legs of a route in the
  caller's transaction, which calls another service before it commits or rolls back) and
  `append-leg-1`, `append-leg-2` (a leg appended to a route alone). A planner's batch may wait
  on a booking's key or route lock while an appended leg of its other route decides (0023's
  race); an operator's replay of a dead leg is handed to the relay while a later leg of its
  route is the head (0023's other case): B4 sees either as two heads.

What must hold (the world's S1 and L1 cover the claims and the recorded keys):

    B1  after every step: one run committed per key — the key's claim (an intent) at most once,
        and a recorded key's job settled done at most once (a stale copy acknowledged unrun,
        never run to a second commit)
    B2  once quiet: every message the broker set aside past its delivery limit is visible —
        a relayed job's row dead (or moved on: a copy that lost its race), an unrecorded one
        in the queue's dead letters — and the broker holds nothing more
        (every message published acknowledged or dead-lettered: none silently dropped)
    B3  once faults stop, no message is given back (rejected) twice: a copy found stale is
        acknowledged, and a delivery whose settlement lost its race is given back once, to be
        found stale
    B5  after every step: the broker's delivery limit is in force — no message of the queue
        that came back unsettled `max_deliveries` times is still delivered (it is set aside)
    B4  after every step (PostgreSQL): one head per ordered group in the broker — at most one
        `leg` of a route relayed with its current attempt's publish written (migration 0023)
    B6  after every step: a delivery handed back unrun is counted by no broker — of what a
        worker held when told to stop (none of it started), nothing comes back as a return its
        broker counts (a rejection, or held on a connection its worker closed), unless the
        connection was lost or its process died meanwhile. So a message set aside past its
        delivery limit was counted only for deliveries that failed or took their worker down
        (the broker's own record of why each return was counted, `SimBroker.counted`)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from oncebox.brokers.transport import BrokerTransport
from oncebox.jobs.retry import Retry
from oncebox.kernel.errors import OnceboxError, StoreUnavailable
from oncebox.lanes.assembly import broker_transport, build_given_up_sweep
from oncebox.lanes.consumer import Consumer, ConsumerConfig
from oncebox.lanes.given_up import GivenUpSweepConfig
from oncebox.queue.context import JobContext
from oncebox.sim.broker import SimBroker, SimQueue
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Body, Part, Rows, Stage, Starter, in_own_transaction, own_connection

QUEUE = "brokered"
MAX_DELIVERIES = 3
BROKER = f"amqp://sim/?max_deliveries={MAX_DELIVERIES}"
TASK = "ship"
KEY = "ship/{n}"
KEYS = 3
POISON = 9  # a key ending in 9 takes its worker down
RECORDED = 10  # recorded keys start here (PostgreSQL)
LEASE = timedelta(seconds=30)
STOP = 0.25  # PostgreSQL: a consumer's worker told to stop before one of its transactions
LEG = "leg"  # PostgreSQL: an ordered task on the queue, its groups kept in order by the relay
LEG_KEY = "leg/{route}/{n}"
ROUTES = 2
# a route's legs, at most: ordered legs run one at a time through the broker, so a world whose
# enqueuers ran on without a bound left more than its quiet phase can run (PostgreSQL, 150 steps)
LEGS_PER_ROUTE = 6
# a booking's transaction calls another service before it commits, holding what it enqueued
SLOW_CALL = 2.0  # seconds of the run's time: in a world, until the clock actor next moves it


@dataclass
class _Lane:
    """One worker's consumer lane on the queue: its connection and its consumer."""

    transport: BrokerTransport
    consumer: Consumer
    stopped: bool = False  # told to stop: it exits after the round under way

    def close(self) -> None:
        """As a stopping worker closes its lanes: the consumer, then the broker's connection
        (what its prefetch held handed back, then closed)."""
        try:
            self.consumer.close()
        finally:
            self.transport.close()


class Brokered(Part):
    """See the module docstring."""

    name = "brokered"
    # once faults stop one consumer lane drains the queue (each kept lane is steps a drain
    # pays for); the two race while the faults run
    keep: tuple[str, ...] = ("broker-1", "given-up")

    def __init__(self, world: Stage) -> None:
        self.world = world
        self.postgres = world.real.dialect == "postgres"
        self.broker = SimBroker(
            world.scheduler, world.choices, world.clock_now, world.store.keep_for_crash
        )
        # what stopping workers held, none of it started: message ids by delivery tag (B6)
        self.unrun: dict[int, str] = {}
        box, choices, scheduler = world.box, world.choices, world.scheduler
        box.runtime.wire_for = self.broker.wire
        box.queue(QUEUE, broker=BROKER)
        retry = Retry(max_attempts=2, base_delay=timedelta(seconds=1))

        @box.task(name=TASK, key=KEY, queue=QUEUE, retry=retry)
        def ship(ctx: JobContext, n: int) -> None:
            if n % 10 == POISON:
                scheduler.crash_here(f"{TASK}/{n} takes its worker down")
            if choices.below(6) == 0:
                raise RuntimeError("the shipment failed")

        self.ship = ship
        if self.postgres:  # an ordered task keeps its order only recorded, through the relay

            @box.task(name=LEG, key=LEG_KEY, queue=QUEUE, group_by="route", retry=retry)
            def leg(ctx: JobContext, route: int, n: int) -> None:
                if choices.below(6) == 0:
                    raise RuntimeError("the leg failed")

            self.leg = leg
            # the legs' key canaries, recorded as the application's earlier run did (a check
            # outside an actor is no yield point): a first check would cost each leg enqueuer
            # two of the few steps a world gives it
            box.runtime.key_guard.require_task(box.runtime.registry.resolve(LEG))
        self.enqueued: set[tuple[int, int]] = set()  # (route, n) of the legs known enqueued
        self.numbered = [0] * ROUTES  # the legs numbered so far, each route's
        self.appended: set[tuple[int, int]] = set()  # (route, n) of the legs appended

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> Mapping[str, Starter]:
        actors: dict[str, Starter] = {
            "publish": lambda: self.world.loop(self._publish),
            "broker-1": lambda: self._consumer("b1"),
            "broker-2": lambda: self._consumer("b2"),
            "given-up": self._sweep,
        }
        if self.postgres:
            actors["enqueue-legs"] = lambda: self._busy(self._legs)
            actors["legs-in-tx"] = self._legs_in_tx
            actors["append-leg-1"] = lambda: self._busy(self._append_leg)
            actors["append-leg-2"] = lambda: self._busy(self._append_leg)
        return actors

    def _next_leg(self, route: int, besides: tuple[int, ...] = ()) -> int:
        """The route's next leg: the first not yet known to be enqueued (an enqueue that
        returned, or a caller's that committed, named it), nor appended, nor in `besides`."""
        n = 0
        while (route, n) in self.enqueued or (route, n) in self.appended or n in besides:
            n += 1
        self.numbered[route] = max(self.numbered[route], n + 1)
        return n

    def _enqueued(self, rows: list[dict[str, int]]) -> None:
        self.enqueued.update((row["route"], row["n"]) for row in rows)
        self.world.wanted.update(LEG_KEY.format(**row) for row in rows)

    def _legs(self) -> None:
        """A planner: the next leg of each route in one statement, the routes in the seed's
        order. Its insert may wait on a leg a booking holds (the same key, or its route's lock
        at the statement's end) while a leg appended to its other route decides (0023's
        race)."""
        first = self.world.choices.below(ROUTES)
        rows = [{"route": route, "n": self._next_leg(route)} for route in (first, 1 - first)]
        rows = [row for row in rows if row["n"] < LEGS_PER_ROUTE]
        if not rows:
            self.world.scheduler.point("idle")  # every route planned: nothing more to enqueue
            return
        self.world.box.enqueue_many(self.leg, rows)
        self._enqueued(rows)

    def _append_leg(self) -> None:
        """A leg appended to a route, alone: it takes the route's next number."""
        route = self.world.choices.below(ROUTES)
        if self.numbered[route] >= LEGS_PER_ROUTE:
            self.world.scheduler.point("idle")  # the route is planned to its end
            return
        row = {"route": route, "n": self.numbered[route]}
        self.numbered[route] += 1
        self.appended.add((route, row["n"]))
        self.world.box.enqueue(self.leg, route=route, n=row["n"])
        self._enqueued([row])

    def _legs_in_tx(self) -> Body:
        """A booking: the next one to three legs of a route, each enqueued in the caller's
        transaction (their keys and the route's lock held from the first), which then calls
        another service (a rest of `SLOW_CALL`) and commits or rolls back."""
        world = self.world
        state: dict[str, Any] = {}

        def round_() -> None:
            conn = own_connection(world, state)
            route, legs = world.choices.below(ROUTES), 1 + world.choices.below(3)
            rows: list[dict[str, int]] = []

            def work() -> None:
                for _ in range(legs):
                    row = {"route": route, "n": self._next_leg(route, tuple(r["n"] for r in rows))}
                    if row["n"] >= LEGS_PER_ROUTE:
                        break
                    rows.append(row)
                    world.box.enqueue(self.leg, connection=conn, route=route, n=row["n"])
                world.scheduler.rest(SLOW_CALL)  # holding its rows and its route's lock

            if in_own_transaction(world, conn, work)[0]:
                self._enqueued(rows)

        return self._busy(round_)

    def _busy(self, round_: Callable[[], object]) -> Body:
        """An enqueuer with no pause between its rounds: its store calls are its yield points.
        A round that fails pauses at `idle` (one that failed before its first call must not
        spin). The leg enqueuers' rounds run so: with an `idle` between them, each would move
        every other pick of the two or three a 60-step world gives it."""
        scheduler = self.world.scheduler

        def body() -> None:
            while True:
                try:
                    round_()
                except (StoreUnavailable, OnceboxError):
                    scheduler.point("idle")

        return body

    def _publish(self) -> None:
        choices = self.world.choices
        n = POISON if choices.chance(0.05) else choices.below(KEYS)
        if self.postgres and choices.below(2) == 0:
            self.world.box.enqueue(self.ship, n=RECORDED + n)
            self.world.wanted.add(KEY.format(n=RECORDED + n))
        else:
            self.world.box.publish_unrecorded(self.ship, n=n)

    def _consumer(self, name: str) -> Body:
        """A consumer lane; on PostgreSQL, now and then, its worker told to stop (a deploy's
        SIGTERM) before one of its transactions: the batch under way gives back what it has
        not started, the lane closes, and a new worker starts in its place a round later."""
        config = ConsumerConfig(
            batch_size=2, max_batch_size=2, lease=LEASE, lock_timeout=timedelta(hours=1)
        )

        def body() -> None:  # built in the actor's own thread: its connections die with it
            lane = self._lane(name, config)

            def round_() -> None:
                nonlocal lane
                if lane.stopped:  # the worker exits, and a new one starts in its place
                    lane.close()
                    lane = self._lane(name, config)
                    return
                lane.consumer.run_once()

            self.world.loop(round_)()

        return body

    def _lane(self, name: str, config: ConsumerConfig) -> _Lane:
        runtime, world = self.world.box.runtime, self.world
        transport = broker_transport(runtime, QUEUE, config, name)
        assert isinstance(transport, BrokerTransport) and isinstance(transport.queue, SimQueue)
        lane = _Lane(transport, world.box.consumer(config, transport=transport, name=f"sim-{name}"))
        wire = transport.queue

        def stopping() -> bool:  # asked before each transaction of a batch, as a worker's is
            if lane.stopped or not self.postgres:
                return lane.stopped
            if world.choices.chance(STOP):
                lane.stopped = True
                self.unrun.update(wire.holding())  # none started: each handed back unrun
            return lane.stopped

        lane.consumer.stopping = stopping
        return lane

    def _sweep(self) -> Body:
        runtime = self.world.box.runtime

        def body() -> None:
            sweep = build_given_up_sweep(
                runtime, {QUEUE: BROKER}, GivenUpSweepConfig(batch_size=2), worker="sim-given-up"
            )
            self.world.loop(sweep.run_once)()

        return body

    def counted(self, rows: Rows) -> dict[str, tuple[int, int]]:
        """An unrecorded message's completion leaves its claim (an intent, never pruned here)
        and no job; a copy absorbed by a claim, or found stale, counts a claim conflict and
        leaves nothing: at most one a delivery."""
        [(claims,)] = rows(
            f"SELECT count(*) FROM oncebox_intents i WHERE i.task = '{TASK}' AND NOT EXISTS "
            "(SELECT 1 FROM oncebox_all_jobs j WHERE j.key = i.key)"
        )
        delivered = self.broker.handed_out
        return {"jobs_completed": (int(claims), int(claims)), "claim_conflicts": (0, delivered)}

    def unfinished(self, rows: Rows) -> int:
        return self.broker.waiting()

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        found: list[Violation] = []
        for key, count in rows(
            f"SELECT key, count(*) FROM oncebox_intents WHERE task = '{TASK}' GROUP BY key"
        ):
            if int(count) > 1:
                found.append(Violation("B1", f"{key} was run to {count} commits (claims)"))
        if self.postgres:
            done = {
                str(key): int(count)
                for key, count in rows(
                    f"SELECT key, count(*) FROM oncebox_all_jobs WHERE task = '{TASK}' "
                    "AND state = 'done' GROUP BY key"
                )
            }
            for key, count in sorted(done.items()):
                if count > 1:
                    found.append(Violation("B1", f"{key}: {count} jobs settled done"))
        if self.postgres:
            for group, heads in rows(
                "SELECT j.group_key, count(*) FROM oncebox_all_jobs j JOIN oncebox_outbox o "
                "ON o.key = '~relay/' || j.id || '/' || (j.attempt + 1) "
                f"WHERE j.task = '{LEG}' AND j.state = 'relayed' GROUP BY j.group_key"
            ):
                if int(heads) > 1:
                    found.append(Violation("B4", f"route {group} has {heads} heads published"))
        for message in self.broker.returned(f"oncebox.{QUEUE}", MAX_DELIVERIES):
            found.append(
                Violation(
                    "B5",
                    f"message {message.message_id} came back {MAX_DELIVERIES} times and is "
                    "still delivered: its broker's delivery limit is not in force",
                )
            )
        for message_id in self.broker.rejected_twice:
            found.append(Violation("B3", f"message {message_id} given back twice once quiet"))
        return found + self._counted_unrun()

    def _counted_unrun(self) -> list[Violation]:
        """B6: what a stopping worker handed back unrun, counted by its broker all the same."""
        found: list[Violation] = []
        for tag, message_id in sorted(self.unrun.items()):
            cause = self.broker.counted.get(tag)
            if cause in ("rejected", "closed"):
                found.append(
                    Violation(
                        "B6",
                        f"message {message_id}: handed back unrun by a stopping worker, and "
                        f"counted by its broker ({cause}) as a delivery that took a worker down",
                    )
                )
        return found

    def quiet(self, rows: Rows) -> list[Violation]:
        found: list[Violation] = []
        if self.broker.waiting():
            found.append(
                Violation("B2", f"the broker still holds {self.broker.waiting()} message(s)")
            )
        dead_letters = {m.message_id for m in self.broker.dead_letters(QUEUE)}
        jobs = {
            int(i): (str(state), int(attempt))
            for i, state, attempt in rows(
                f"SELECT id, state, attempt FROM oncebox_all_jobs WHERE task = '{TASK}'"
            )
        }
        for message in self.broker.given_up_ever:
            body = json.loads(message.body)
            if "job" not in body:
                if message.message_id not in dead_letters:
                    found.append(Violation("B2", f"{body}: set aside, and not in the dead letters"))
                continue
            state, attempt = jobs.get(int(body["job"]), ("gone", 0))
            if state == "relayed" and attempt == int(body["run"]) - 1:
                found.append(
                    Violation("B2", f"job {body['job']} run {body['run']} set aside, still {state}")
                )
        return found
