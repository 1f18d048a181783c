"""The chaos checker's invariants under a Hypothesis state machine, in one process.

The freight workload (weekly digest, hold expiry) on a fresh SQLite file per example, its email
channel behind the idempotent fake HTTP API. Hypothesis interleaves what goes wrong in
production — duplicate publishes (to the table queue and through an at-least-once broker),
clock jumps from seconds to days (across ISO-week and ISO-year boundaries, with the new week's
fan-out), consumer and dispatcher passes that crash at a named point, scripted provider faults,
operator redrives and replays — with normal work passes, and checks after every step:

    S1  at most one intent per key
    S3  all-or-nothing: an active customer's claimed digest key has its rendered digest and
        exactly one outbox row (an inactive customer's claim has neither: the handler skips
        them); an expired hold has exactly one notice row; nothing without its claim
    S5  the idempotent provider took each token at most once; it took only outbox tokens
    S4  (in part) a `sent` message really reached the provider
    S8  dead jobs and dead messages carry their attempts and their last error
    P1  the schedule fanned out exactly the ISO weeks of its fires (labelled here, not by oncebox)

At the end the system is drained to quiescence (moving the clock to each next event, like
`RunContext.drain`; L1 if it never settles) and S2/S4 are checked: nothing non-terminal, every
eligible key (active, non-poison customer x fanned-out week) claimed once or dead, the poison
dead without an intent, no due hold left held. Then an operator heals what is left (replays dead
letters, resolves ambiguous sends `sent` or `resend` by what the provider has; L2 if that never
ends) and every eligible key and expired hold must end with one sent message, delivered once.

The CI profile (40 examples of up to 20 steps) takes ~15-25 s. A bigger run, without pytest's
timeout: `ONCEBOX_HYPOTHESIS_EXAMPLES=500 ONCEBOX_HYPOTHESIS_STEPS=40 pytest <this file>`.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
from collections import Counter
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from oncebox import Box, Retry, WorkerConfig
from oncebox.chaos.runner import iso_label, monday_fire
from oncebox.examples.logistics.app import (
    DIGEST_KEY,
    HOLD_KEY,
    SENDER,
    build_box,
    connect,
    create_tables,
)
from oncebox.examples.logistics.seed import seed_freight
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.jobs.periods import zone
from oncebox.kernel import points
from oncebox.kernel.clock import ClockSetting, to_micros
from oncebox.kernel.errors import StoreUnavailable
from oncebox.lanes.consumer import ConsumerConfig
from oncebox.lanes.dispatcher import DispatcherConfig
from oncebox.runtime.operations import DeadFilter
from oncebox.testing import RedeliveringTransport

EXAMPLES = int(os.environ.get("ONCEBOX_HYPOTHESIS_EXAMPLES", "40"))
STEPS = int(os.environ.get("ONCEBOX_HYPOTHESIS_STEPS", "20"))
BIG_RUN = {"ONCEBOX_HYPOTHESIS_EXAMPLES", "ONCEBOX_HYPOTHESIS_STEPS"} & set(os.environ)
SECRET = "statemachine-secret-0123456789abcdef"
CHANNEL_RETRY = Retry(max_attempts=4, base_delay=timedelta(seconds=30))
WORK = WorkerConfig(until_idle=True, simulated_time=True, exit_on_hung_handler=False)
SETTLE_STEP = timedelta(seconds=15)  # past the next event, like RunContext.drain
SETTLE_ROUNDS = 400
HEAL_ROUNDS = 10
CRASH_POINTS = (
    "consumer.after_claim_insert",
    "consumer.after_handler_before_commit",
    "dispatcher.after_lease",
    "dispatcher.after_provider_accept_before_record",
)
FAULTS = ("500", "503", "429:30", "accept-then-reset")
TERMINAL_JOB = ("done", "dead", "cancelled")
TERMINAL_MESSAGE = ("sent", "dead", "ambiguous")
# (year, ISO week) the run starts in: mid-year, or the last week before an ISO-year boundary —
# Monday 2025-12-29 is already 2026-W01; 2026 has 53 ISO weeks
START_WEEKS = ((2026, 33), (2025, 52), (2026, 53))
ZONES = ("UTC", "Pacific/Auckland")  # Monday 09:00 in Auckland is still Sunday in UTC

DELTAS = st.one_of(
    st.integers(1, 59).map(lambda n: timedelta(seconds=n)),
    st.integers(1, 59).map(lambda n: timedelta(minutes=n)),
    st.integers(1, 23).map(lambda n: timedelta(hours=n)),
    st.integers(1, 9).map(lambda n: timedelta(days=n)),
)


class Crash(Exception):
    """What an interrupted pass dies of."""


@dataclass
class Snapshot:
    """The database and the provider, read with plain SQL and the fake's own log."""

    intents: Counter[str]
    jobs: list[tuple[int, str, str, str | None]]  # id, key, state, last_error
    job_attempts: Counter[int]
    outbox: list[tuple[int, str, str, str, str | None]]  # id, intent key, state, token, error
    delivery_attempts: Counter[int]
    digests: set[tuple[int, str]]
    active: set[int]
    holds: list[tuple[int, str, int]]  # id, state, expires_at (micros)
    runs: set[str]
    accepted: Counter[str]

    def jobs_by_key(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for _id, key, state, _error in self.jobs:
            found.setdefault(key, []).append(state)
        return found

    def outbox_by_key(self) -> dict[str, list[tuple[int, str, str, str, str | None]]]:
        found: dict[str, list[tuple[int, str, str, str, str | None]]] = {}
        for message in self.outbox:
            found.setdefault(message[1], []).append(message)
        return found


def digest_parts(key: str) -> tuple[int, str]:
    _, customer, period = key.split("/")
    return int(customer.removeprefix("customer-")), period


class FreightMachine(RuleBasedStateMachine):
    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.api: FakeEmailApi | None = FakeEmailApi().start()
        self._box: Box | None = None
        self.closed = False
        self.customers = 0
        self.poison = 0
        self.tz = "UTC"
        self.periods: set[str] = set()  # the weeks the schedule must have fanned out
        self.crashes = 0

    @property
    def box(self) -> Box:
        assert self._box is not None, "seeded first"
        return self._box

    # -- the model's clock and weeks -------------------------------------------------------------

    def now(self) -> datetime:
        return self.box.store.clock_now()

    def set_clock(self, instant: datetime) -> None:
        """Move the database's clock (forward only) and note the week whose fire is now the
        latest: the next tick (explicit, or any work pass's) fans it out (catch-up `latest`)."""
        assert instant >= self.now()
        self.box.store.clock_set(ClockSetting(frozen_at=instant))
        self.periods.add(iso_label(self.latest_fire(instant), self.tz))

    def latest_fire(self, instant: datetime) -> datetime:
        """The schedule's last Monday 09:00 (in its zone) at or before `instant`."""
        today = instant.astimezone(zone(self.tz)).date()
        fire = self.monday_fire(today)
        return fire if fire <= instant else self.monday_fire(today - timedelta(days=7))

    def next_fire(self, instant: datetime) -> datetime:
        """The schedule's first Monday 09:00 after `instant`."""
        today = instant.astimezone(zone(self.tz)).date()
        fire = self.monday_fire(today)
        return fire if fire > instant else self.monday_fire(today + timedelta(days=7))

    def monday_fire(self, day: date) -> datetime:
        year, week, _ = day.isocalendar()
        return monday_fire(year, week, self.tz)

    def tick(self) -> None:
        self.box.ticker().run_once()

    def customer(self, index: int) -> int:
        return index % self.customers + 1

    # -- set-up ----------------------------------------------------------------------------------

    @initialize(
        seed=st.integers(0, 2**16),
        customers=st.sampled_from((8, 12, 16)),
        week=st.sampled_from(START_WEEKS),
        tz=st.sampled_from(ZONES),
    )
    def seed(self, seed: int, customers: int, week: tuple[int, int], tz: str) -> None:
        """The freight tables and customers, the clock at the week's Monday fire, its fan-out."""
        assert self.api is not None
        self._box = build_box(f"sqlite:///{self.folder / 'freight.db'}", secret=SECRET, tz=tz)
        self.box.channel(
            "email", provider=self.api.url + "?timeout=1", sender=SENDER, retry=CHANNEL_RETRY
        )
        self.box.rng.seed(seed)  # backoff jitter: a failing example replays alike
        self.customers, self.tz = customers, tz
        create_tables(self.box)
        fire = monday_fire(*week, tz=tz)
        self.box.store.clock_set(ClockSetting(frozen_at=fire))
        self.poison = seed_freight(
            self.box, customers, iso_label(fire, tz), random.Random(seed), fire
        )
        self.set_clock(fire + timedelta(seconds=30))
        fan_outs = self.box.ticker().run_once().fan_outs
        assert [f.period for f in fan_outs] == [iso_label(fire, tz)], fan_outs

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        customer=st.integers(0, 15),
        weeks_back=st.integers(0, 2),
        bulk=st.booleans(),
    )
    def enqueue(self, customer: int, weeks_back: int, bulk: bool) -> None:
        """The producer publishes a digest again (any customer, this week or an earlier one):
        the key's claim or active job absorbs it."""
        periods = sorted(self.periods)
        period = periods[-1 - min(weeks_back, len(periods) - 1)]
        args: dict[str, Any] = {"customer_id": self.customer(customer), "period": period}
        if bulk:
            self.box.enqueue_many("weekly_digest", [args])
        else:
            self.box.enqueue("weekly_digest", **args)

    @rule(
        customers=st.lists(st.integers(0, 15), min_size=1, max_size=4),
        copies=st.integers(1, 3),
        seed=st.integers(0, 1000),
        batch=st.sampled_from((1, 3, 100)),
        weeks_back=st.integers(0, 1),
    )
    def broker_redelivery(
        self, customers: list[int], copies: int, seed: int, batch: int, weeks_back: int
    ) -> None:
        """An at-least-once broker delivers digests several times, out of order, beside the
        table queue: every copy after the first completes as a duplicate at the claim."""
        periods = sorted(self.periods)
        period = periods[-1 - min(weeks_back, len(periods) - 1)]
        broker = RedeliveringTransport(copies=copies, seed=seed)
        for index in customers:
            broker.publish("weekly_digest", customer_id=self.customer(index), period=period)
        consumer = self.box.consumer(ConsumerConfig(batch_size=batch), transport=broker)
        try:
            for _ in range(200):
                if not broker.pending:
                    break
                consumer.run_once()
            assert not broker.pending, "the broker's deliveries never settled"
        finally:
            consumer.session.close()

    @rule(delta=DELTAS)
    def advance_clock(self, delta: timedelta) -> None:
        """Time passes (seconds to days); the scheduler fans out a week whose fire passed."""
        self.set_clock(self.now() + delta)
        self.tick()

    @rule(offset=st.integers(-120, 6 * 3600))
    def next_week(self, offset: int) -> None:
        """Jump to around the next Monday 09:00 fire (from just before it to hours after)."""
        now = self.now()
        self.set_clock(max(now, self.next_fire(now) + timedelta(seconds=offset)))
        self.tick()

    @rule(
        point=st.sampled_from(CRASH_POINTS),
        nth=st.integers(1, 3),
        batch=st.sampled_from((1, 2, 100)),
        hard=st.booleans(),
    )
    def crashing_pass(self, point: str, nth: int, batch: int, hard: bool) -> None:
        """A consumer or dispatcher pass dies at the `nth` arrival at a named point. `hard`: the
        consumer cannot even give its leases back (they run out and are rescued later). A crash
        after the provider accepted leaves the message sent but unrecorded: resent later with
        the same idempotency key, the provider answers from its memory."""
        arrivals = 0

        def crash(name: str) -> None:
            nonlocal arrivals
            arrivals += 1
            if arrivals == nth:
                raise Crash(f"crash at {name} (arrival {nth})")

        with points.installed({point: crash}):
            if point.startswith("consumer."):
                crashed = self._consume_until(ConsumerConfig(batch_size=batch), hard)
            else:
                crashed = self._dispatch_until(DispatcherConfig(batch_size=batch))
        self.crashes += crashed
        note(f"{point} arrival {nth}: {'crashed' if crashed else 'not reached'}")

    def _consume_until(self, config: ConsumerConfig, hard: bool) -> bool:
        consumer = self.box.consumer(config)
        if hard:

            def unreachable(*_args: Any) -> None:
                raise StoreUnavailable("the crashed process cannot give its leases back")

            consumer.transport.release = unreachable  # type: ignore[method-assign,assignment]  # a crash
        try:
            for _ in range(100):
                if not consumer.run_once().leased:
                    return False
        except Crash:
            return True
        finally:
            consumer.session.close()
        raise AssertionError("the consumer pass never went idle")

    def _dispatch_until(self, config: DispatcherConfig) -> bool:
        dispatcher = self.box.dispatcher(config)
        try:
            for _ in range(100):
                if not dispatcher.run_once().leased:
                    return False
        except Crash:
            return True
        raise AssertionError("the dispatcher pass never went idle")

    @rule(lanes=st.sampled_from(("all", "consume", "dispatch")))
    def work(self, lanes: str) -> None:
        """A normal worker pass until idle (scheduler, sweeper, rescuer included), with both
        lanes or one: deployments split them, and messages then wait for a sender."""
        self.box.work(
            config=replace(WORK, consume=lanes != "dispatch", dispatch=lanes != "consume")
        )

    @rule(actions=st.lists(st.sampled_from(FAULTS), min_size=1, max_size=4))
    def provider_faults(self, actions: list[str]) -> None:
        """The provider's next answers: 5xx, a 30 s throttle, a delivery whose answer is lost."""
        assert self.api is not None
        self.api.script(*actions)

    @rule()
    def redrive_dead_deliveries(self) -> None:
        self.box.replay_dead(
            DeadFilter(kind="delivery"),
            reason="redrive after the provider recovered",
            per_second=1000,
            sleep=lambda _s: None,
        )

    @rule(index=st.integers(0, 7))
    def replay_dead_job(self, index: int) -> None:
        dead = self.box.dead_letters(DeadFilter(kind="job"))
        if dead:
            self.box.replay(dead[index % len(dead)].id, reason="operator replay", kind="job")

    # -- reading ---------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        conn = connect(self.box)
        try:

            def rows(sql: str) -> list[Any]:
                return list(conn.execute(sql).fetchall())

            snap = Snapshot(
                intents=Counter(r[0] for r in rows("SELECT key FROM oncebox_intents")),
                jobs=[
                    (int(r[0]), r[1], r[2], r[3])
                    for r in rows("SELECT id, key, state, last_error FROM oncebox_all_jobs")
                ],
                job_attempts=Counter(
                    {
                        int(r[0]): int(r[1])
                        for r in rows(
                            "SELECT job_id, count(*) FROM oncebox_job_attempts GROUP BY job_id"
                        )
                    }
                ),
                outbox=[
                    (int(r[0]), r[1], r[2], r[3], r[4])
                    for r in rows(
                        "SELECT id, intent_key, state, token, last_error FROM oncebox_outbox"
                    )
                ],
                delivery_attempts=Counter(
                    {
                        int(r[0]): int(r[1])
                        for r in rows(
                            "SELECT outbox_id, count(*) FROM oncebox_delivery_attempts "
                            "GROUP BY outbox_id"
                        )
                    }
                ),
                digests={
                    (int(r[0]), r[1])
                    for r in rows("SELECT customer_id, period FROM freight_digests")
                },
                active={
                    int(r[0]) for r in rows("SELECT id FROM freight_customers WHERE active = 1")
                },
                holds=[
                    (int(r[0]), r[1], int(r[2]))
                    for r in rows("SELECT id, state, expires_at FROM freight_holds")
                ],
                runs={
                    r[0]
                    for r in rows(
                        "SELECT period FROM oncebox_schedule_runs WHERE schedule = 'weekly-digest'"
                    )
                },
                accepted=Counter(),
            )
        finally:
            conn.close()
        assert self.api is not None
        snap.accepted = Counter(t for t in self.api.tokens() if t is not None)
        return snap

    def eligible(self, snap: Snapshot) -> set[str]:
        """Every active customer but the poison, for every week fanned out."""
        return {
            DIGEST_KEY.format(customer_id=c, period=p)
            for c in snap.active - {self.poison}
            for p in self.periods
        }

    def poison_keys(self) -> set[str]:
        return {DIGEST_KEY.format(customer_id=self.poison, period=p) for p in self.periods}

    # -- invariants after every step -------------------------------------------------------------

    @invariant()
    def invariants_hold(self) -> None:
        self.check_step(self.snapshot())

    def check_step(self, snap: Snapshot) -> None:
        problems: list[str] = []
        for check in (self._one_intent, self._all_or_nothing, self._effects, self._dead_letters):
            problems += check(snap)
        if snap.runs != self.periods:
            problems.append(
                f"P1: fan-outs for {sorted(snap.runs)}, fires in {sorted(self.periods)}"
            )
        assert not problems, "\n".join(problems)

    def _one_intent(self, snap: Snapshot) -> list[str]:
        """S1, and the poison never holds a claim."""
        found = [f"S1 {key}: {n} intents" for key, n in snap.intents.items() if n > 1]
        for key in sorted(self.poison_keys()):
            if snap.intents[key]:
                found.append(f"S2 {key}: the poison holds an intent")
        return found

    def _all_or_nothing(self, snap: Snapshot) -> list[str]:
        """S3: a claimed digest key has its digest row and one outbox row (an inactive
        customer's none), an expired hold one notice; no row without its claim."""
        found: list[str] = []
        outbox = snap.outbox_by_key()
        digest_keys = {k for k in snap.intents if k.startswith("weekly-digest/")}
        digest_keys |= {k for k in outbox if k.startswith("weekly-digest/")}
        digest_keys |= {DIGEST_KEY.format(customer_id=c, period=p) for c, p in snap.digests}
        for key in sorted(digest_keys):
            customer, period = digest_parts(key)
            claimed, messages = snap.intents[key], len(outbox.get(key, []))
            digest = (customer, period) in snap.digests
            if customer in snap.active:
                ok = claimed == 1 and digest and messages == 1
            else:
                ok = not digest and not messages
            if not ok:
                found.append(
                    f"S3 {key}: {claimed} intents, digest row {digest}, {messages} outbox rows"
                    f"{'' if customer in snap.active else ' (inactive customer)'}"
                )
        expired = {HOLD_KEY.format(hold_id=h) for h, state, _at in snap.holds if state == "expired"}
        notices = {k for k in outbox if k.startswith("hold-expired/")}
        for key in sorted(expired | notices):
            if key not in expired or len(outbox.get(key, [])) != 1:
                found.append(
                    f"S3 {key}: hold expired {key in expired}, {len(outbox.get(key, []))} notices"
                )
        return found

    def _effects(self, snap: Snapshot) -> list[str]:
        """S5 and a sent message's delivery (S4): what the provider took, against the outbox."""
        found = [f"S5 token {t}: accepted {n} times" for t, n in snap.accepted.items() if n > 1]
        tokens = {m[3] for m in snap.outbox}
        for token in sorted(set(snap.accepted) - tokens):
            found.append(f"S5 token {token}: delivered, but no outbox row has it")
        for message_id, key, state, token, _error in snap.outbox:
            if state == "sent" and not snap.accepted[token]:
                found.append(f"S4 {key}: message {message_id} is sent; the provider has none")
        return found

    def _dead_letters(self, snap: Snapshot) -> list[str]:
        """S8: every dead letter has its attempts and its last error."""
        found = [
            f"S8 {key}: job {job_id} dead without history"
            for job_id, key, state, error in snap.jobs
            if state == "dead" and (not snap.job_attempts[job_id] or not error)
        ]
        found += [
            f"S8 {key}: message {message_id} dead without history"
            for message_id, key, state, _token, error in snap.outbox
            if state == "dead" and (not snap.delivery_attempts[message_id] or not error)
        ]
        return found

    # -- the end: settle, check, heal, check -------------------------------------------------------

    def teardown(self) -> None:
        try:
            # a step that already failed is what Hypothesis reports and shrinks: settling on
            # top of it would only bury it under a second failure
            if sys.exc_info()[0] is None and self.customers:
                self.settle()
                self.check_settled(self.snapshot())
                self.heal()
                self.check_healed(self.snapshot())
        finally:
            self.close()

    def settle(self) -> None:
        """Work until nothing is workable, moving the clock to each next event (a retry, a
        channel pause, a lease that must run out): the faults have healed."""
        for _ in range(SETTLE_ROUNDS):
            self.box.work(config=WORK)
            self.check_step(self.snapshot())
            upcoming = self.box.store.status_times().next_event()
            if upcoming is None:
                return
            self.set_clock(max(self.now(), upcoming) + SETTLE_STEP)
        raise AssertionError(f"L1: not settled after {SETTLE_ROUNDS} rounds of work")

    def check_settled(self, snap: Snapshot) -> None:
        """S2 and S4 once quiescent."""
        problems: list[str] = []
        jobs = snap.jobs_by_key()
        outbox = snap.outbox_by_key()
        problems += [
            f"S4 {key}: job {job_id} still {state}"
            for job_id, key, state, _error in snap.jobs
            if state not in TERMINAL_JOB
        ]
        problems += [
            f"S4 {key}: message {message_id} still {state}"
            for message_id, key, state, _token, _error in snap.outbox
            if state not in TERMINAL_MESSAGE
        ]
        for key in sorted(self.eligible(snap)):
            dead = "dead" in jobs.get(key, [])
            if snap.intents[key] != 1 and not dead:
                problems.append(f"S2 {key}: {snap.intents[key]} intents at the end, no dead job")
            if not outbox.get(key) and not dead:
                problems.append(f"S4 {key}: eligible, but no message was written")
        for key in sorted(self.poison_keys()):
            if jobs.get(key) != ["dead"] or snap.intents[key]:
                problems.append(
                    f"S2 {key}: the poison should be one dead job and no intent: jobs "
                    f"{jobs.get(key)}, {snap.intents[key]} intents"
                )
        now = to_micros(self.now())
        problems += [
            f"S4 hold {hold_id}: due at the last pass, still {state}"
            for hold_id, state, expires_at in snap.holds
            if state == "held" and expires_at <= now
        ]
        assert not problems, "\n".join(problems)

    def heal(self) -> None:
        """The operator's morning: replay dead jobs (but the poison's) and dead deliveries,
        settle ambiguous sends by asking the provider; until nothing is left to heal."""
        resolved: Counter[int] = Counter()
        for _ in range(HEAL_ROUNDS):
            snap = self.snapshot()
            jobs = [
                job_id
                for job_id, key, state, _error in snap.jobs
                if state == "dead" and key not in self.poison_keys()
            ]
            dead = [m[0] for m in snap.outbox if m[2] == "dead"]
            ambiguous: list[tuple[int, Literal["sent", "resend"]]] = [
                (m[0], "sent" if snap.accepted[m[3]] else "resend")
                for m in snap.outbox
                if m[2] == "ambiguous"
            ]
            if not (jobs or dead or ambiguous):
                return
            for job_id in jobs:
                self.box.replay(job_id, reason="heal", kind="job")
            for message_id in dead:
                self.box.replay(message_id, reason="heal", kind="delivery")
            for message_id, answer in ambiguous:
                resolved[message_id] += 1
                self.box.resolve(message_id, answer, reason="checked with the provider")
            self.settle()
        final = self.snapshot()
        left = [
            f"job {job_id} ({key}) still dead: {error}"
            for job_id, key, state, error in final.jobs
            if state == "dead" and key not in self.poison_keys()
        ]
        left += [
            f"message {message_id} ({key}) still {state} after {resolved[message_id]} "
            f"resolutions; the provider has it {final.accepted[token]} times: {error}"
            for message_id, key, state, token, error in final.outbox
            if state in ("dead", "ambiguous")
        ]
        raise AssertionError(f"L2: not healed after {HEAL_ROUNDS} rounds:\n" + "\n".join(left))

    def check_healed(self, snap: Snapshot) -> None:
        """Every eligible key: one intent, one message, sent, delivered once; every expired
        hold's notice too."""
        problems: list[str] = []
        outbox = snap.outbox_by_key()
        keys = self.eligible(snap) | {
            HOLD_KEY.format(hold_id=h) for h, state, _at in snap.holds if state == "expired"
        }
        for key in sorted(keys):
            messages = outbox.get(key, [])
            if key.startswith("weekly-digest/") and snap.intents[key] != 1:
                problems.append(f"S2 {key}: {snap.intents[key]} intents after healing")
            if [(m[2], snap.accepted[m[3]]) for m in messages] != [("sent", 1)]:
                problems.append(
                    f"S4 {key}: messages {[m[2] for m in messages]}, delivered "
                    f"{[snap.accepted[m[3]] for m in messages]} times after healing"
                )
        assert not problems, "\n".join(problems)
        note(f"{len(keys)} keys delivered once; {self.crashes} crashed passes")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self._box is not None:
                self._box.close()
        finally:
            if self.api is not None:
                self.api.stop()
                self.api = None
            shutil.rmtree(self.folder, ignore_errors=True)


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# a failure is shrunk (for minutes) before it is reported: pytest must not kill it half-way
@pytest.mark.timeout(0 if BIG_RUN else 900)
def test_the_chaos_invariants_hold_under_any_interleaving(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    run_state_machine_as_test(
        lambda: FreightMachine(tmp_path_factory.mktemp("freight")),  # type: ignore[arg-type]  # a factory is called too
        settings=SETTINGS,
    )
