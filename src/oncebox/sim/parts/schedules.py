"""A schedule at work: two tickers racing for each period's fan-out, an external cron's trigger
beside them, and an operator taking over the fan-outs of owners judged gone.

- `ticks`, fired every five minutes from 09:00 to 09:55 (the world starts at 09:00, so its clock
  crosses several), its period the fire's minute (`20260105T0905`), `catch_up="all"`: each
  period fans out `tick(period, n)`, keyed `tick/{period}/{n}`, for two keys, one a batch (so an
  owner can stop between its batches, its run half fanned out); the handler returns;
- actors: `ticker-1`, `ticker-2` (the real `ScheduleTicker`, built by `build_ticker`, each under
  an owner name of its own, and a new one each time it is started again, as a new process has:
  a fan-out's extend and finish are fenced on the owner, so two of one name would pass for each
  other), resting a minute between rounds; `trigger`, the verb behind the HTTP trigger and
  `oncebox schedule run`'s cron use (`runtime/trigger.py`), a round every five minutes; and, in
  one world in two (a person on call, by the seed), `take-over`: an operator who takes over a
  running fan-out whose owner is judged gone (`runtime/fanout.py`, audited) rather than wait
  out its lease (one whose lease ran out is the scheduler's to resume). An owner stalls when
  the clock moves on while it is parked mid-fan-out, and crashes or loses its connection by
  the scheduler's faults, like any actor.
- the quiet phase is a cron-only deployment's: the tickers stop with the enqueuers (crashed
  where they stand, a fan-out perhaps half-way), the trigger and the operator go on, so a
  fan-out left stalled must be resumed by the trigger.

An owner's renewals run in a thread on the host's clock (`schedules/owners.py`): inside a run
they are held off (`runner.py`), so an owner is heard from only through its batches (each
extends its run). An owner parked longer than `LIVE_WITHIN` is judged gone, and may be taken
over: as one cut off from the store would be.

What must hold, after every step:

    W1  one job per (schedule, period, key): every job of the schedule has the key its period
        and subject render, under the period it was fanned out for, and only for a period fanned
        out (a run claimed)
    W2  a fan-out run has one owner at a time: its owner changes (a stalled run claimed, a run
        taken over) only from an owner gone at that instant (`owners.judge`: not renewed within
        `LIVE_WITHIN`, or its lease run out), and a finished run is never claimed again
    W3  a stale owner's write commits nothing: a run's lease, renewal, count or end changes only
        in a step of the actor that owns it (a claim or a take-over aside, which W2 judges)

And every period fanned out must reach an end once faults stop: its run done, its keys wanted
(L1: each a job at an end).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from oncebox.jobs.periods import custom
from oncebox.kernel.errors import OnceboxError, StoreUnavailable
from oncebox.lanes.assembly import build_ticker
from oncebox.lanes.ticker import TickerConfig
from oncebox.queue.context import JobContext
from oncebox.runtime.fanout import take_over
from oncebox.runtime.trigger import ScheduleTrigger
from oncebox.schedules.owners import judge
from oncebox.schedules.schedule import ScheduleContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Body, Part, Rows, Stage, Starter
from oncebox.sim.parts.retained import instant

NAME = "ticks"
TASK = "tick"
KEY = "tick/{period}/{n}"
KEYS = 2
CRON = "*/5 9 * * *"
TICKER_EVERY = timedelta(minutes=1)  # the ticker's interval (its steps are the world's too)
TRIGGER_EVERY = timedelta(minutes=5)  # an external cron's, at the schedule's own pace
OPERATOR_EVERY = timedelta(seconds=30)  # how often the operator looks at `status`
TICKERS = ("ticker-1", "ticker-2")


@dataclass(frozen=True)
class _Run:
    """A run as the checker last saw it (a `HeldRun` for `owners.judge`)."""

    state: str
    owner: str | None
    lease_expires_at: datetime | None
    renewed_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    enqueued: int

    @property
    def holder(self) -> tuple[str | None, datetime | None]:
        """Who claimed the run, and when: a new claim changes it, even by the same owner."""
        return self.owner, self.started_at


class Schedules(Part):
    """See the module docstring."""

    name = "schedules"
    keep = ("trigger", "take-over")

    def __init__(self, world: Stage) -> None:
        self.world = world
        self.owners: dict[str, str] = {}  # each actor's owner name, in its current life
        self._lives = itertools.count(1)
        self.runs: dict[str, _Run] = {}  # each period's run as last seen
        # one world in two has a person on call who takes fan-outs over; in the others a
        # stalled fan-out waits for the scheduler alone (the seed's first say in the part)
        self.on_call = world.choices.below(2) == 0

        @world.box.task(name=TASK, key=KEY)
        def tick(ctx: JobContext, period: str, n: int) -> None:
            """A subject's share of the period: nothing to do but be done once."""

        @world.box.schedule(
            NAME,
            cron=CRON,
            period=custom("minute", lambda fire: fire.strftime("%Y%m%dT%H%M")),
            task=tick,
            catch_up="all",
            batch_size=1,
        )
        def subjects(ctx: ScheduleContext) -> Iterator[dict[str, Any]]:
            for n in range(KEYS):
                yield {"period": ctx.period, "n": n}

        self.schedule = subjects
        # deployed before the workers start: its keys recorded (`oncebox keys`), the schedule
        # known from 09:00 on (its first fire due at once)
        runtime = world.box.runtime
        runtime.key_guard.require_schedule(subjects)
        runtime.key_guard.require_task(runtime.registry.resolve(TASK))
        runtime.store.schedule_state(NAME, subjects.grace)

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> Mapping[str, Starter]:
        starters: dict[str, Starter] = {name: self._ticker(name) for name in TICKERS}
        starters["trigger"] = lambda: self._paced("trigger", self._trigger, TRIGGER_EVERY)
        if self.on_call:
            starters["take-over"] = lambda: self._paced(
                "take-over", self._take_over, OPERATOR_EVERY
            )
        return starters

    def _life(self, actor: str) -> str:
        """A new owner name for an actor's new life (a process started again has a new one)."""
        owner = f"sim-{actor}#{next(self._lives)}"
        self.owners[actor] = owner
        return owner

    def _ticker(self, actor: str) -> Starter:
        runtime = self.world.box.runtime

        def start() -> Body:
            def body() -> None:  # built in the actor's own thread, as a worker builds its lanes
                owner = self._life(actor)
                ticker = build_ticker(runtime, TickerConfig(interval=TICKER_EVERY), owner=owner)
                self._rounds(ticker.run_once, TICKER_EVERY)

            return body

        return start

    def _paced(self, actor: str, round_: Any, every: timedelta) -> Body:
        """A person's or a cron's actor: its first round comes `every` after it starts (a cron
        fires at its times, not when its host boots)."""

        def body() -> None:
            self._life(actor)
            self.world.scheduler.rest(every.total_seconds())
            self._rounds(round_, every)

        return body

    def _rounds(self, round_: Any, every: timedelta) -> None:
        """Run `round_` again and again, resting `every` between rounds (no steps burned)."""
        while True:
            with contextlib.suppress(StoreUnavailable, OnceboxError):
                round_()
            self.world.scheduler.rest(every.total_seconds())

    def _trigger(self) -> None:
        """An external cron fires the schedule (the HTTP trigger's and `schedule run`'s verb)."""
        owner = self.owners["trigger"]
        ScheduleTrigger(self.world.box.runtime, owner).fire(self.schedule)

    def _take_over(self) -> None:
        """The operator reads `status`, and takes over a fan-out whose owner stopped renewing,
        rather than wait out its lease (one whose lease ran out is the scheduler's to resume)."""
        store = self.world.box.store
        now = store.clock_now()
        gone = [
            run
            for run in store.schedule_run_running()
            if (judged := judge(run, now)) is not None and judged.gone and not judged.lease_ended
        ]
        if not gone:
            return
        run = gone[self.world.choices.below(len(gone))]
        take_over(
            self.world.box.runtime,
            self.schedule,
            run.period,
            self.owners["take-over"],
            actor="sim",
            reason="sim: its owner is gone",
        )

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        runs = {
            str(period): _Run(
                str(state),
                None if owner is None else str(owner),
                instant(lease),
                instant(renewed),
                instant(started),
                instant(finished),
                int(enqueued),
            )
            for period, state, owner, lease, renewed, started, finished, enqueued in rows(
                "SELECT period, state, owner, lease_expires_at, renewed_at, started_at, "
                f"finished_at, enqueued_count FROM oncebox_schedule_runs WHERE schedule = '{NAME}'"
            )
        }
        for period in runs:
            self.world.wanted.update(KEY.format(period=period, n=n) for n in range(KEYS))
        found = self._jobs(rows, runs)
        movers = self.world.scheduler.moved()
        for period in sorted(set(runs) & set(self.runs)):
            found += self._moved(period, self.runs[period], runs[period], movers)
        self.runs = runs
        return found

    def _jobs(self, rows: Rows, runs: Mapping[str, _Run]) -> list[Violation]:
        found = []
        seen: set[str] = set()
        for job_id, key, schedule, period, state in rows(
            f"SELECT id, key, schedule, period, state FROM oncebox_all_jobs WHERE task = '{TASK}'"
        ):
            rendered = {KEY.format(period=period, n=n) for n in range(KEYS)}
            if schedule != NAME or key not in rendered or str(period) not in runs:
                found.append(
                    Violation(
                        "W1",
                        f"job {job_id} {key} (schedule {schedule}, period {period}) is not a "
                        "subject of a period fanned out",
                    )
                )
            if state != "cancelled" and key in seen:
                found.append(Violation("W1", f"{key} was fanned out twice"))
            if state != "cancelled":
                seen.add(str(key))
        return found

    def _moved(self, period: str, was: _Run, now: _Run, movers: set[str]) -> list[Violation]:
        if was == now:
            return []
        at = self.world.clock_now()
        if was.state == "done" and now.state == "running":
            return [Violation("W2", f"{NAME} {period}: a finished fan-out was claimed again")]
        if now.holder != was.holder:
            judged = judge(was, at)
            if was.state == "running" and judged is not None and not judged.gone:
                return [
                    Violation(
                        "W2",
                        f"{NAME} {period}: {now.owner} took the run from {was.owner}, alive "
                        f"(renewed {_ago(was.renewed_at, at)}, its lease to "
                        f"{was.lease_expires_at:%H:%M:%S})",
                    )
                ]
            return []
        mine = {self.owners.get(mover) for mover in movers}
        if was.owner is not None and was.owner not in mine:
            who = ", ".join(f"{m} ({self.owners.get(m)})" for m in sorted(movers))
            return [
                Violation(
                    "W3",
                    f"{NAME} {period}: {who} wrote to {was.owner}'s run "
                    f"({was.state} → {now.state}, enqueued {was.enqueued} → {now.enqueued})",
                )
            ]
        return []

    def unfinished(self, rows: Rows) -> int:
        [(running,)] = rows(
            "SELECT count(*) FROM oncebox_schedule_runs "
            f"WHERE schedule = '{NAME}' AND state = 'running'"
        )
        return int(running)

    def quiet(self, rows: Rows) -> list[Violation]:
        return [
            Violation("L1", f"{NAME} {period}: its fan-out is still running ({run.owner})")
            for period, run in sorted(self.runs.items())
            if run.state == "running"
        ]


def _ago(then: datetime | None, now: datetime) -> str:
    return "never" if then is None else f"{(now - then).total_seconds():g} s ago"
