"""One world: a store, a box declared as a user would, the providers, and the actors.

The tasks and channels are small on purpose, so that actors collide: a handful of customers and
two periods make every key wanted by several enqueues, every job leased by several consumers.

- `notice(customer, period)`, keyed `notice/{customer}/{period}`: its handler writes one message
  to each channel and then, by the run's choice, returns, asks to be retried later, fails, or
  fails for good;
- one key's messages the database refuses (`REFUSED`, a trigger on the outbox, as a business
  constraint would): its handler always returns, its transaction is always refused, and it must
  end dead after its attempts, costing the jobs that shared its batches nothing;
- `mail`: an idempotent provider (a one-hour window); `hook`: a provider that keeps no keys, its
  unknown outcomes held for a person (`ambiguity="hold"`).

Each actor is a loop over real code with a yield point between its rounds: enqueuers (one at a
time, and many at once), two consumers, two dispatchers, the lease rescuer (which rescues the
outbox's expired leases too), the resolver, an operator (replay, discard, cancel, resolve), and
the clock, which moves the store's frozen time by small steps and, now and then, past every
lease. A crashed actor is started again at once, as a supervisor restarts a worker: a new lane,
a new session, nothing carried over.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from oncebox.box import Box
from oncebox.jobs.retry import Retry
from oncebox.kernel.clock import ClockSetting
from oncebox.kernel.errors import OnceboxError, Permanent, RetryLater, StoreUnavailable
from oncebox.lanes.assembly import build_lease_rescuer, build_resolver
from oncebox.lanes.consumer import ConsumerConfig
from oncebox.lanes.dispatcher import DispatcherConfig
from oncebox.lanes.lease_rescuer import LeaseRescuerConfig
from oncebox.queue.context import JobContext
from oncebox.sim.choices import Choices
from oncebox.sim.providers import SimProvider
from oncebox.sim.scheduler import Scheduler
from oncebox.sim.yields import YieldingStore
from oncebox.store import open_store
from oncebox.store.params import JobFilter, OutboxFilter
from oncebox.store.records import OutboxState

START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
CUSTOMERS = 4
PERIODS = ("2026-W01", "2026-W02")
LEASE = timedelta(seconds=30)
WINDOW = timedelta(hours=1)
# How far the clock actor moves time, by choice: steps that leave leases alone, then past them.
CLOCK_STEPS = (
    timedelta(seconds=1),
    timedelta(seconds=5),
    timedelta(seconds=20),
    LEASE + timedelta(seconds=1),
    timedelta(minutes=10),
)
NOTICE_KEY = "notice/{customer}/{period}"
REFUSED = "notice/3/2026-W02"  # the key whose messages the database refuses (`_refusal`)
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
    mail: SimProvider = field(init=False)
    hook: SimProvider = field(init=False)
    wanted: set[str] = field(default_factory=set)
    runs: Counter[tuple[int, int]] = field(default_factory=Counter)  # handler runs, by attempt
    now: datetime = START
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.real = open_store(self.url, migrate=True)
        self.real.clock_set(ClockSetting(frozen_at=START))
        self._business_table()
        self._refusal()
        store = YieldingStore(self.real, self.scheduler)
        self.scheduler.on_crash = store.drop_sessions
        self.box = Box(store=store, secret=SECRET, seed=0)
        self.mail = SimProvider("mail", self.scheduler, self.choices, self._now, WINDOW)
        self.hook = SimProvider("hook", self.scheduler, self.choices, self._now)
        retry = Retry(
            max_attempts=4, base_delay=timedelta(seconds=1), max_delay=timedelta(seconds=10)
        )
        self.box.channel("mail", self.mail, retry=retry, batch_size=2)
        self.box.channel("hook", self.hook, retry=retry, ambiguity="hold", batch_size=2)
        choices = self.choices

        @self.box.task(key=NOTICE_KEY, retry=retry, timeout=timedelta(seconds=60))
        def notice(ctx: JobContext, customer: int, period: str) -> None:
            self.runs[(ctx.job_id or 0, ctx.attempt)] += 1
            address = f"customer-{customer}@example.com"
            body = {"from": "ops@example.com", "to": address, "subject": period, "text": "hi"}
            ctx.connection.execute(
                "INSERT INTO sim_effects (key, job_id, attempt) VALUES (?, ?, ?)"
                if self.real.dialect == "sqlite"
                else "INSERT INTO sim_effects (key, job_id, attempt) VALUES (%s, %s, %s)",
                (NOTICE_KEY.format(customer=customer, period=period), ctx.job_id, ctx.attempt),
            )
            ctx.outbox.add("mail", body, suffix="mail")
            ctx.outbox.add("hook", {"customer": customer, "period": period}, suffix="hook")
            roll = choices.below(20)
            if NOTICE_KEY.format(customer=customer, period=period) == REFUSED:
                return  # the refusal is the database's alone: nothing else ends this job
            if roll == 0:
                raise RetryLater("the handler asked for later", timedelta(seconds=5))
            if roll == 1:
                raise RuntimeError("the handler failed")
            if roll == 2:
                raise Permanent("the handler refused for good")

        self.notice = notice

    def _business_table(self) -> None:
        """The handler's own effect, written through the claim's connection: one row per run
        whose transaction committed (`sim_effects`; no unique key, so a second commit shows)."""
        conn = self.real.connect()
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS sim_effects (key TEXT NOT NULL, job_id BIGINT, "
                "attempt INTEGER NOT NULL)"
            )
            conn.execute("DELETE FROM sim_effects")  # a PostgreSQL schema serves many worlds
            conn.commit()
        finally:
            conn.close()

    def _refusal(self) -> None:
        """The database refuses `REFUSED`'s messages, inside the consumer's transaction (SQLite
        raises at the insert, PostgreSQL likewise): a write refused for what it holds, which
        no retry changes."""
        conn = self.real.connect()
        try:
            if self.real.dialect == "sqlite":
                conn.execute(
                    "CREATE TRIGGER sim_refused BEFORE INSERT ON oncebox_outbox "
                    f"WHEN NEW.intent_key = '{REFUSED}' "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the database'); END"
                )
            else:
                conn.execute(
                    "CREATE OR REPLACE FUNCTION sim_refused() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'refused by the database'; END $$"
                )
                conn.execute(
                    "CREATE OR REPLACE TRIGGER sim_refused BEFORE INSERT ON oncebox_outbox "
                    "FOR EACH ROW "
                    f"WHEN (NEW.intent_key = '{REFUSED}') EXECUTE FUNCTION sim_refused()"
                )
            conn.commit()
        finally:
            conn.close()

    def _now(self) -> datetime:
        return self.now

    def providers(self) -> dict[str, SimProvider]:
        """Each channel's provider, by the channel's name: what the checker counts copies from."""
        return {"mail": self.mail, "hook": self.hook}

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        with contextlib.suppress(Exception):
            self.box.runtime.channel_set.close()
        self.real.close()

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> dict[str, Callable[[], Callable[[], None]]]:
        """Each actor's name and how to start it (again, after a crash): a factory of its
        body, so a restart builds new lanes with new sessions."""
        return {
            "enqueue": lambda: self._loop(self._enqueue_one),
            "enqueue-many": lambda: self._loop(self._enqueue_many),
            "consumer-1": lambda: self._consumer("c1"),
            "consumer-2": lambda: self._consumer("c2"),
            "dispatcher-1": lambda: self._dispatcher("d1"),
            "dispatcher-2": lambda: self._dispatcher("d2"),
            "rescuer": self._rescuer,
            "resolver": self._resolver,
            "operator": lambda: self._loop(self._operate),
            "clock": lambda: self._loop(self._tick),
        }

    def _loop(self, round_: Callable[[], object]) -> Callable[[], None]:
        def body() -> None:
            while True:
                # a lost connection, a refusal: the lane's own loop would go on
                with contextlib.suppress(StoreUnavailable, OnceboxError):
                    round_()
                self.scheduler.point("idle")

        return body

    def _key(self) -> tuple[int, str]:
        return self.choices.below(CUSTOMERS), PERIODS[self.choices.below(len(PERIODS))]

    def _enqueue_one(self) -> None:
        customer, period = self._key()
        self.box.enqueue(self.notice, customer=customer, period=period)
        self.wanted.add(NOTICE_KEY.format(customer=customer, period=period))  # it was taken

    def _enqueue_many(self) -> None:
        rows = [self._key() for _ in range(1 + self.choices.below(3))]
        self.box.enqueue_many(self.notice, [{"customer": c, "period": p} for c, p in rows])
        self.wanted.update(NOTICE_KEY.format(customer=c, period=p) for c, p in rows)

    def _built(self, build: Callable[[], Callable[[], object]]) -> Callable[[], None]:
        """A body that builds its lane in its own thread (so its sessions are its own, and die
        with it), then runs its rounds."""

        def body() -> None:
            self._loop(build())()

        return body

    def _consumer(self, name: str) -> Callable[[], None]:
        config = ConsumerConfig(
            batch_size=2,
            max_batch_size=2,
            lease=LEASE,
            lock_timeout=timedelta(hours=1),  # a wait is the scheduler's to end, never a timer
        )
        return self._built(lambda: self.box.consumer(config, name=f"sim-{name}").run_once)

    def _dispatcher(self, name: str) -> Callable[[], None]:
        config = DispatcherConfig(batch_size=2, lease=LEASE)
        return self._built(lambda: self.box.dispatcher(config, name=name).run_once)

    def _rescuer(self) -> Callable[[], None]:
        runtime, channels = self.box.runtime, self.box.channels
        return self._built(
            lambda: build_lease_rescuer(runtime, LeaseRescuerConfig(), channels).run_once
        )

    def _resolver(self) -> Callable[[], None]:
        runtime, channels = self.box.runtime, self.box.channels
        return self._built(lambda: build_resolver(runtime, channels).run_once)

    def _tick(self) -> None:
        """Time passes for every process at once: the store's clock and the monotonic clock
        every lane paces itself by move together."""
        step = CLOCK_STEPS[self.choices.below(len(CLOCK_STEPS))]
        self.scheduler.point("clock")
        self.now += step
        self.scheduler.elapsed += step.total_seconds()
        self.real.clock_set(ClockSetting(frozen_at=self.now))

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
