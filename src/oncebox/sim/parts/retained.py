"""Retention at work: the pruner racing the lanes and the operator, on a task and a channel that
keep their rows for minutes, not weeks, so that a world's clock takes them past their retention.

- `tidy(n)`, keyed `tidy/{n}`, three keys: finished jobs kept 2 minutes (`keep_jobs`), intents
  5 minutes (`keep_intents`: after that a key may run again, as docs/guarantees.md says); its
  handler writes one message to `archive` and, by the run's choice, returns or fails for good
  (a dead job, which the operator may replay);
- `archive`: payloads kept 1 minute, messages 3 minutes; its provider keeps keys for an hour.
  (A channel's messages wait for the longest job retention in force, the box's 14 days, so no
  message row is deleted in a world's time: the payloads are);
- actors: `enqueue-tidy` (one job; a key enqueued again while its intent lives is a duplicate)
  and `pruner` (the lane, a pass a round), which goes on in the quiet phase.

What must hold, after every step (docs/guarantees.md, "retention never takes a row that
serves"), for every task and channel of the world, not only this part's:

    P1  a job is deleted only once done or cancelled, past its task's `keep_jobs` since it
        finished, and with every message it wrote sent or discarded; a message only once sent
        (or discarded), past its channel's `keep_messages`, its job already gone; a payload is
        dropped only from a sent message past `keep_payloads`; an intent only of a task that
        sets `keep_intents`, past it since the claim, or freed by the discard of its last message
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from oncebox.jobs.retry import Retry
from oncebox.kernel.clock import from_micros
from oncebox.kernel.errors import Permanent
from oncebox.lanes.assembly import build_pruner
from oncebox.lanes.pruner import PrunerConfig, plan_for
from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Part, Rows, Stage, Starter
from oncebox.sim.providers import SimProvider

TASK = "tidy"
KEY = "tidy/{n}"
KEYS = 3
KEEP_JOBS = timedelta(minutes=2)
KEEP_INTENTS = timedelta(minutes=5)
KEEP_PAYLOADS = timedelta(minutes=1)
KEEP_MESSAGES = timedelta(minutes=3)


def instant(value: Any) -> datetime | None:
    """An instant as either store returns it (microseconds on SQLite, aware on PostgreSQL)."""
    if value is None or isinstance(value, datetime):
        return value
    return from_micros(int(value))


class Retained(Part):
    """See the module docstring."""

    name = "retained"
    keep = ("pruner",)

    def __init__(self, world: Stage) -> None:
        self.world = world
        box, choices = world.box, world.choices
        self.archive = SimProvider(
            "archive", world.scheduler, choices, world.clock_now, timedelta(hours=1)
        )
        world.providers["archive"] = self.archive
        retry = Retry(max_attempts=2, base_delay=timedelta(seconds=1))
        box.channel(
            "archive",
            self.archive,
            retry=retry,
            batch_size=2,
            keep_payloads=KEEP_PAYLOADS,
            keep_messages=KEEP_MESSAGES,
        )

        @box.task(key=KEY, retry=retry, keep_jobs=KEEP_JOBS, keep_intents=KEEP_INTENTS)
        def tidy(ctx: JobContext, n: int) -> None:
            ctx.outbox.add("archive", {"n": n}, suffix="archive")
            if choices.below(4) == 0:
                raise Permanent("tidy refused for good")

        self.tidy = tidy
        # what was last seen of every row, to judge one that is gone
        self.jobs: dict[int, tuple[str, str, datetime | None]] = {}
        self.messages: dict[int, tuple[int | None, str, str, bool, datetime | None]] = {}
        self.intents: dict[str, tuple[str, datetime | None]] = {}
        self.payloads: set[int] = set()  # messages whose payload was seen dropped

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> Mapping[str, Starter]:
        loop = self.world.loop
        return {
            "enqueue-tidy": lambda: loop(self._enqueue),
            "pruner": self._pruner,
        }

    def _enqueue(self) -> None:
        n = self.world.choices.below(KEYS)
        self.world.box.enqueue(self.tidy, n=n)
        self.world.wanted.add(KEY.format(n=n))

    def _pruner(self) -> Any:
        runtime = self.world.box.runtime

        def body() -> None:  # built in the actor's own thread, as a worker builds its lanes
            pruner = build_pruner(runtime, PrunerConfig(batch_size=2))
            self.world.loop(pruner.run_once)()

        return body

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        plan = plan_for(self.world.box.runtime)
        now = self.world.clock_now()
        jobs = {
            int(i): (str(task), str(state), instant(finished))
            for i, task, state, finished in rows(
                "SELECT id, task, state, finished_at FROM oncebox_all_jobs"
            )
        }
        messages = {
            int(i): (
                None if job is None else int(job),
                str(channel),
                str(state),
                discarded is not None,
                instant(sent),
            )
            for i, job, channel, state, discarded, sent, dropped in self._messages(rows)
        }
        dropped = {int(row[0]) for row in self._messages(rows) if row[6] is not None}
        intents = {
            str(key): (str(task), instant(claimed))
            for key, task, claimed in rows("SELECT key, task, claimed_at FROM oncebox_intents")
        }
        found: list[Violation] = []
        for job_id in sorted(set(self.jobs) - set(jobs)):
            task, state, finished = self.jobs[job_id]
            keep = plan.policy("jobs", task)
            serving = [
                m
                for m, (owner, _c, m_state, discarded, _s) in self.messages.items()
                if owner == job_id and m_state != "sent" and not discarded
            ]
            if state not in ("done", "cancelled") or serving:
                why = f"it was {state}" if not serving else f"message {serving[0]} was not sent"
                found.append(Violation("P1", f"job {job_id} ({task}) was deleted while {why}"))
            elif keep is None or finished is None or finished + keep > now:
                found.append(Violation("P1", f"job {job_id} ({task}) was deleted early"))
        for row_id in sorted(set(self.messages) - set(messages)):
            owner, channel, state, discarded, sent = self.messages[row_id]
            keep = plan.policy("messages", channel)
            if state != "sent" and not discarded:
                found.append(Violation("P1", f"message {row_id} was deleted while {state}"))
            elif owner is not None and owner in jobs:
                found.append(Violation("P1", f"message {row_id} was deleted before its job"))
            elif keep is None or sent is None or sent + keep > now:
                found.append(Violation("P1", f"message {row_id} ({channel}) was deleted early"))
        for row_id in sorted(dropped - self.payloads):
            _job, channel, state, _discarded, sent = messages[row_id]
            keep = plan.policy("payloads", channel)
            if state != "sent" or keep is None or sent is None or sent + keep > now:
                found.append(
                    Violation("P1", f"message {row_id} ({channel}) lost its payload early")
                )
        released = self._released(rows)
        for key in sorted(set(self.intents) - set(intents) - released):
            task, claimed = self.intents[key]
            keep = plan.policy("intents", task)
            if keep is None or claimed is None or claimed + keep > now:
                found.append(Violation("P1", f"the intent of {key} ({task}) was deleted"))
        self.jobs, self.messages, self.intents = jobs, messages, intents
        self.payloads = dropped
        return found

    @staticmethod
    def _released(rows: Rows) -> set[str]:
        """The intents an operator freed: the discard of the last message of a key standing
        releases the key, so that a re-run of its job may write it afresh."""
        intent_of = {int(i): str(k) for i, k in rows("SELECT id, intent_key FROM oncebox_outbox")}
        freed = set()
        for target, details in rows(
            "SELECT target_id, details FROM oncebox_audit WHERE action = 'discard'"
        ):
            said = json.loads(details) if isinstance(details, (str, bytes)) else details
            if said.get("intent_released") and int(target) in intent_of:
                freed.add(intent_of[int(target)])
        return freed

    @staticmethod
    def _messages(rows: Rows) -> list[Any]:
        return rows(
            "SELECT id, job_id, channel, state, discarded_at, sent_at, payload_dropped_at "
            "FROM oncebox_outbox"
        )
