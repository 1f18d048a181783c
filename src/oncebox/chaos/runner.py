"""One scenario run: a fresh database, the seeded freight workload, a provider, one clock.

`RunContext` is what a scenario script drives: it fans out a week, spawns worker processes with
a fault plan, moves the clock, and drains the system until nothing is workable. Afterwards the
checker reads the database, the provider's log and the history. The seed fixes the fault
schedule (which customers, which arrival at a point), not the operating system's interleaving.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import multiprocessing
import os
import random
import secrets
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeAlias

from oncebox import Box, WorkerConfig
from oncebox.chaos import mutations
from oncebox.chaos.broker import left_in_broker, run_broker, run_queue
from oncebox.chaos.history import HistoryWriter
from oncebox.chaos.private_broker import PrivateBroker
from oncebox.chaos.private_nats import PrivateNats
from oncebox.chaos.private_server import PrivateServer
from oncebox.chaos.rows import read_rows, unsettled
from oncebox.chaos.violation import Violation
from oncebox.chaos.workload import (
    REPORTS_SECRET_ENV,
    Gate,
    Lanes,
    PointPlan,
    Term,
    Timing,
    Workload,
    build,
    clock_holder_main,
    publisher_main,
    racer_main,
    taker_main,
    worker_main,
)
from oncebox.chaos.workspace import workspace
from oncebox.examples.logistics.app import connect, create_tables
from oncebox.examples.logistics.seed import is_active, seed_freight
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.fakes.smtp_sink import SmtpSink
from oncebox.kernel import clock
from oncebox.kernel.clock import ClockLease, monotonic
from oncebox.runtime.fanout import FanOutResult

SPAWN = multiprocessing.get_context("spawn")
SETTLE_STEP = timedelta(seconds=15)
BROKER_ROUNDS = 3  # rounds in a row a drain spends on what only the broker still holds
OwnBroker: TypeAlias = PrivateBroker | PrivateNats  # a broker of the run's own, to restart


class NotSettled(RuntimeError):
    """Work remains after every round: a liveness violation (L1), reported, not a crash."""


ProviderKind = Literal["api", "smtp"]
DRAIN = WorkerConfig(until_idle=True, simulated_time=True, exit_on_hung_handler=False)
PROVIDER_TIMEOUT_S = 1  # accept-then-timeout answers after 2 s: the client has given up by then


def monday_fire(year: int, week: int, tz: str = "UTC") -> datetime:
    """Monday 09:00 of an ISO week in `tz`, as UTC: when the weekly-digest schedule fires."""
    from oncebox.jobs.periods import zone  # noqa: PLC0415

    local = datetime.fromisocalendar(year, week, 1).replace(hour=9, tzinfo=zone(tz))
    return local.astimezone(UTC)


def iso_label(instant: datetime, tz: str = "UTC") -> str:
    """The checker's own ISO-week label for an instant (independent of oncebox.jobs.periods)."""
    from oncebox.jobs.periods import zone  # noqa: PLC0415

    year, week, _ = instant.astimezone(zone(tz)).isocalendar()
    return f"{year:04d}-W{week:02d}"


@dataclass
class Provider:
    kind: ProviderKind
    api: FakeEmailApi | None = None
    smtp: SmtpSink | None = None

    @property
    def url(self) -> str:
        if self.api is not None:
            window = self.api.window / timedelta(hours=1)
            return f"{self.api.url}?timeout={PROVIDER_TIMEOUT_S}&window_hours={window:g}"
        assert self.smtp is not None
        return f"smtp://{self.smtp.host}:{self.smtp.port}?timeout={PROVIDER_TIMEOUT_S}"

    def script(self, *actions: str) -> None:
        if self.api is not None:
            self.api.script(*actions)
        else:
            assert self.smtp is not None
            self.smtp.script(*actions)

    def accepted(self) -> dict[str, int]:
        """Per outbox token, how many times the provider took the message (an idempotent API
        counts replays of one key once: they are one effect)."""
        tokens = self.api.tokens() if self.api is not None else (self.smtp or SmtpSink()).tokens()
        counts: dict[str, int] = {}
        for token in tokens:
            if token is not None:
                counts[token] = counts.get(token, 0) + 1
        return counts


@contextmanager
def provider(kind: ProviderKind, window: timedelta) -> Iterator[Provider]:
    if kind == "api":
        with FakeEmailApi(window=window) as api:
            yield Provider(kind, api=api)
    else:
        with SmtpSink() as smtp:
            yield Provider(kind, smtp=smtp)


@dataclass
class RunSettings:
    scenario: str
    server: str | None
    customers: int
    seed: int
    provider: ProviderKind = "api"
    ambiguity: Literal["hold", "retry"] = "hold"
    tz: str = "UTC"
    week: tuple[int, int] = (2026, 33)
    mutations: tuple[str, ...] = ()
    window: timedelta = timedelta(hours=24)  # the HTTP API's idempotency window
    timing: Timing | None = None  # a run on the real clock (no test clock at all)
    sneak: int = 0  # a customer whose handler tries to end the claim's transaction
    slots: int = 0  # > 0: the digest task runs under oncebox.Concurrency(slots)
    broker: str = ""  # "rabbitmq", "sqs", "nats": the digests' queue is that broker's (relayed)
    broker_url: str | None = None  # the run's own node (None: the machine's broker)
    reports: bool = False  # the provider reports through signed webhooks (chaos/receiver.py)


@dataclass
class RunContext:
    settings: RunSettings
    url: str
    folder: Path
    provider: Provider
    workload: Workload
    box: Box
    rng: random.Random
    poison: int = 0
    periods: list[str] = field(default_factory=list)  # the harness's own labels of its fires
    faults: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    absorbed: int = 0
    history: HistoryWriter | None = None
    clock: ClockLease | None = None  # the harness's hold on the run's clock (None: real)
    settled_s: float | None = None  # real clock: from the faults' end to every key visible
    server: PrivateServer | None = None  # the run's own PostgreSQL, for scenarios that restart it
    broker_node: OwnBroker | None = None  # the run's own broker, likewise
    bound_s: float | None = None  # ... and the bound it had to be within

    @property
    def dialect(self) -> str:
        return self.box.store.dialect

    # -- time ----------------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.box.store.clock_now()

    def set_clock(self, instant: datetime) -> None:
        if self.clock is None:
            raise RuntimeError("this run is on the real clock: it cannot be set")
        self.clock.set(frozen_at=instant)

    def advance(self, delta: timedelta) -> datetime:
        instant = self.now() + delta
        self.set_clock(instant)
        return instant

    # -- the workload --------------------------------------------------------------------------

    def fan_out_now(self) -> FanOutResult:
        """On the real clock: fan out this week's period as an operator's run would (the
        schedule fires on Mondays; this run cannot wait for one)."""
        period = iso_label(self.now(), self.settings.tz)
        self.periods.append(period)
        return self.box.run_schedule("weekly-digest", period)

    def settle_on_real_clock(
        self, terms: tuple[Term, ...], lanes: Lanes | None = None, extra_s: float = 0.0
    ) -> None:
        """The faults have stopped: start workers (until idle, on the real clock) and wait for
        every eligible key to reach a visible state — delivered, or held dead or ambiguous with
        its reason — within the bound the run's timing implies for these faults (L3), plus
        `extra_s` for the run's own load (its messages at a channel's rate). A worker that
        stops early (it refused a test clock that is still held, say) is replaced."""
        timing = self.settings.timing
        assert timing is not None, "settle_on_real_clock is for runs on the real clock"
        self.bound_s = bound = timing.bound(self.dialect, terms) + extra_s
        started = monotonic()
        workers: list[Any] = []
        left: list[str] = []
        try:
            while monotonic() - started <= bound:
                left = unsettled(read_rows(self.box), self.periods, self.poison)
                if not left:
                    self.settled_s = round(monotonic() - started, 2)
                    return
                workers = [w for w in workers if w.is_alive()]
                if not workers:
                    workers.append(self.spawn(f"settler-{len(self.faults)}", lanes=lanes))
                threading.Event().wait(0.1)
        finally:
            for worker in workers:  # settled: they finish; not settled: nothing to wait for
                worker.join(bound if self.settled_s is not None else 0)
                if worker.is_alive():
                    worker.kill()
                    worker.join(10)
        self.violation(
            "L3 visible within the bound",
            left[0] if left else self.settings.scenario,
            f"{len(left)} eligible key(s) or row(s) still not in a visible state {bound:g} s "
            f"after the faults stopped (the bound for {', '.join(terms) or 'no fault'} with "
            f"this run's timing); first: {left[:3]}",
        )

    def fan_out(self, at: datetime | None = None) -> FanOutResult:
        """Set the clock to a Monday fire (+30 s) and let the scheduler fan the week out."""
        fire = at or monday_fire(*self.settings.week, tz=self.settings.tz)
        self.set_clock(fire + timedelta(seconds=30))
        self.periods.append(iso_label(fire, self.settings.tz))
        results = self.box.ticker().run_once().fan_outs
        if not results:
            raise RuntimeError(f"the schedule did not fire at {fire.isoformat()}")
        return results[-1]

    def digest_args(self, customers: list[int], period: str) -> list[dict[str, Any]]:
        return [{"customer_id": c, "period": period} for c in customers]

    def active_customers(self) -> list[int]:
        return [c for c in range(1, self.settings.customers + 1) if is_active(c)]

    # -- faults and processes ------------------------------------------------------------------

    def fault(self, text: str) -> None:
        self.faults.append(text)
        if self.history is not None:
            self.history.write("fault", "ok", self.settings.scenario, text)

    def gate(self) -> Gate:
        return Gate(SPAWN.Event(), SPAWN.Event())

    def barrier(self, parties: int) -> Any:
        return SPAWN.Barrier(parties, timeout=120)

    def label(self, instant: datetime) -> str:
        return iso_label(instant, self.settings.tz)

    def wait(self, gate: Gate, what: str, timeout: float = 120) -> None:
        if not gate.reached.wait(timeout):
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")

    def spawn(
        self,
        name: str,
        plans: tuple[PointPlan, ...] = (),
        gate: Gate | None = None,
        lanes: Lanes | None = None,
        workload: Workload | None = None,
    ) -> Any:
        """A worker process with a fault plan, working until idle."""
        return self._start(
            worker_main, name, (workload or self.workload, name, plans, gate, lanes or Lanes())
        )

    def spawn_racer(self, name: str, customers: list[int], period: str, start: Any) -> Any:
        """A process consuming broker deliveries of these customers' digests."""
        return self._start(racer_main, name, (self.workload, name, customers, period, start))

    def spawn_clock_holder(self, frozen_at: datetime, held: Any) -> Any:
        """A process that freezes the database's clock through a lease, then is SIGKILLed."""
        return self._start(
            clock_holder_main, "clock-holder", (self.workload, "clock-holder", frozen_at, held)
        )

    def spawn_publisher(
        self, name: str, customers: list[int], period: str, gate: Gate, started: Any = None
    ) -> Any:
        """Another process of the app, enqueueing these digests again, one at a time, from
        `gate.reached` until `gate.release` (`started`, an event, set after its first)."""
        target = functools.partial(publisher_main, started=started)
        return self._start(target, name, (self.workload, name, customers, period, gate))

    def spawn_taker(self, name: str, seconds: float, gate: Gate) -> Any:
        """A process taking the email channel's tokens as fast as it can, from `gate.reached`."""
        return self._start(taker_main, name, (self.workload, name, seconds, gate))

    def event(self) -> Any:
        return SPAWN.Event()

    def _start(self, target: Callable[..., None], name: str, args: tuple[Any, ...]) -> Any:
        process = SPAWN.Process(target=target, args=args, name=f"chaos-{name}", daemon=True)
        process.start()
        return process

    def join(self, process: Any, timeout: float = 120) -> int | None:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join(10)
            raise RuntimeError(f"worker {process.name} did not finish within {timeout} s")
        return int(process.exitcode) if process.exitcode is not None else None

    def killed(self, process: Any, timeout: float = 120) -> bool:
        return self.join(process, timeout) == -signal.SIGKILL

    # -- draining ------------------------------------------------------------------------------

    def work(self, config: WorkerConfig = DRAIN) -> None:
        """One until-idle pass of an in-process worker (the harness's own, threads included)."""
        self.box.work(config=config)

    def drain(self, rounds: int = 400, on_round: Callable[[], None] | None = None) -> None:
        """Work until nothing is workable, moving the clock to each next event (a retry, a
        channel pause, a lease that must run out): faults have healed, the system settles."""
        broker_rounds = 0  # rounds in a row for the broker's messages alone
        for _ in range(rounds):
            self.work()
            if on_round is not None:
                on_round()
            self.observe()
            if broker_rounds < BROKER_ROUNDS and self._broker_holds():
                broker_rounds += 1
                continue  # its messages are workable now (the next round takes them)
            broker_rounds = 0  # (messages a round cannot take are left to the checker, B1)
            upcoming = self.box.store.status_times().next_event()
            if upcoming is None:
                return
            # past the next event by half the wait (at least SETTLE_STEP), so that retries
            # spread by jitter are taken together: fewer rounds, the same outcomes
            now = self.now()
            self.set_clock(max(now, upcoming) + max(SETTLE_STEP, (upcoming - now) / 2))
        raise NotSettled(f"the system did not settle within {rounds} rounds of work")

    def _broker_holds(self) -> bool:
        """Whether the run's broker still holds messages of its queue once the round's workers
        exited: visible ones the next round takes, and ones a killed consumer received, which
        SQS makes visible again only when their timeout runs out on its own (real) clock —
        waited for here, since nothing moves that clock."""
        workload = self.workload
        if workload.broker is None:
            return False
        left = left_in_broker(workload.broker, workload.digest_queue)
        if left["in_flight"]:
            wait_until_visible = monotonic() + 10  # a few of SQS's or NATS's timeouts
            while left["in_flight"] and not left["ready"] and monotonic() < wait_until_visible:
                clock.sleep(0.2)
                left = left_in_broker(workload.broker, workload.digest_queue)
        return bool(left["ready"] or left["in_flight"])

    @contextmanager
    def observing(self, every: float = 0.05) -> Iterator[None]:
        """Sample S1 from a thread of its own while worker processes run (observation only:
        nothing waits on it)."""
        done = threading.Event()

        def sample() -> None:
            while not done.wait(every):
                self.observe()

        thread = threading.Thread(target=sample, name="chaos-observer", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(10)
        self.observe()

    def observe(self) -> None:
        """S1 during the run, not only at the end: no key ever has two intents."""
        conn = connect(self.box)
        try:
            rows = conn.execute(
                "SELECT key, count(*) FROM oncebox_intents GROUP BY key HAVING count(*) > 1"
            ).fetchall()
        finally:
            conn.close()
        for key, count in rows:
            self.violation("S1 one intent per key", key, f"{count} intents observed mid-run")

    def restart_server(self) -> None:
        """Restart the run's own PostgreSQL server (never a shared one)."""
        if self.server is None:
            raise RuntimeError("this scenario has no server of its own to restart")
        self.server.restart()

    def restart_broker(self) -> None:
        """Restart the run's own broker, a RabbitMQ node or a NATS server (never the machine's);
        it answers again when this returns."""
        if self.broker_node is None:
            raise RuntimeError("this scenario has no broker of its own to restart")
        self.broker_node.restart()

    def reconnect(self) -> None:
        """After a server restart the harness's own pooled connections are dead: open a new
        box (workers reconnect by themselves; this is the observer's pool)."""
        with contextlib.suppress(Exception):  # its connections died with the server
            self.box.close()
        self.box = build(self.workload, "harness")
        if self.clock is not None:
            self.clock.store = self.box.store

    def count(self, sql: str) -> int:
        conn = connect(self.box)
        try:
            row = conn.execute(sql).fetchone()
        finally:
            conn.close()
        return int(row[0]) if row else 0

    def violation(self, invariant: str, key: str, evidence: str) -> None:
        found = Violation(invariant, key, evidence)
        if found not in self.violations:
            self.violations.append(found)


@contextmanager
def run_context(settings: RunSettings) -> Iterator[RunContext]:
    """A fresh database with the freight tables and customers, a provider, the clock frozen at
    the week's Monday fire; all removed afterwards."""
    mutations.check(settings.mutations)
    with contextlib.ExitStack() as brokers:
        amqp = (
            settings.broker_url or brokers.enter_context(run_broker(settings.broker))
            if settings.broker
            else None
        )
        with _run_context(settings, amqp) as context:
            yield context


@contextmanager
def _run_context(settings: RunSettings, amqp: str | None) -> Iterator[RunContext]:
    with (
        workspace(settings.server) as url,
        provider(settings.provider, settings.window) as fake,
        tempfile.TemporaryDirectory(prefix="oncebox-chaos-history-") as folder,
        run_queue(amqp) if amqp is not None else contextlib.nullcontext("default") as queue,
    ):
        workload = Workload(
            url=url,
            email=fake.url,
            secret=secrets.token_hex(16),
            history=folder,
            seed=settings.seed,
            ambiguity=settings.ambiguity,
            tz=settings.tz,
            mutations=settings.mutations,
            timing=settings.timing,
            sneak=settings.sneak,
            slots=settings.slots,
            broker=amqp,
            digest_queue=queue,
            reports=settings.reports,
        )
        if settings.reports:  # spawned workers inherit it
            os.environ.setdefault(
                REPORTS_SECRET_ENV, "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
            )
        box = build(workload, "harness")
        try:
            create_tables(box)
            if "no-unique-index" in settings.mutations:
                conn = connect(box)
                try:
                    mutations.drop_unique_claim(conn, box.store.dialect)
                finally:
                    conn.close()
            fire = monday_fire(*settings.week, tz=settings.tz)
            clock: ClockLease | None = None
            if settings.timing is None:
                clock = ClockLease(box.store)  # lapses by itself should the harness be killed
                clock.set(frozen_at=fire)
            else:  # the real clock: the week is this one, and holds expire around now
                fire = box.store.clock_now() - timedelta(minutes=1)
            # one fault schedule per (seed, scenario): scenarios do not all draw alike
            rng = random.Random(f"{settings.seed}:{settings.scenario}")
            poison = seed_freight(box, settings.customers, iso_label(fire), rng, fire)
            context = RunContext(
                settings=settings,
                url=url,
                folder=Path(folder),
                provider=fake,
                workload=workload,
                box=box,
                rng=rng,
                poison=poison,
                history=HistoryWriter(Path(folder), "harness", settings.seed),
                clock=clock,
            )
            if fake.api is not None and clock is not None:  # it forgets on the run's clock
                fake.api.now = lambda: context.box.store.clock_now().timestamp()
            try:
                yield context
            finally:
                if context.history is not None:
                    context.history.close()
                box = context.box  # a scenario may have replaced it (reconnect)
                if clock is not None:
                    clock.release()
        finally:
            box.close()
            mutations.undo_process_wide()
