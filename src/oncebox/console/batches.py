"""Batches of dead letters, from the console: a dry run kept while a person confirms, then the
batch run in the background — paced as `oncebox dlq replay --all` paces it — with its progress
shown as it goes.

A dry run's plan is kept in the console's memory under a random id, for the session that made it
(a confirmation names the plan, never a filter that could match more meanwhile), and is taken
once: confirming it twice runs it once. The batch acts on exactly the plan's rows, each fenced on
the attempt it had (`Operations.replay_planned`, `discard_planned`); what it left alone is shown
with why.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Literal

from oncebox.box import Box
from oncebox.jobs.dead_letters import DiscardPlan, ReplayPlan, Skipped
from oncebox.kernel.clock import monotonic
from oncebox.kernel.errors import OnceboxError
from oncebox.runtime.operations import ActionOutcome

PLANS_KEPT = 20  # per console: the oldest dry run is forgotten first
REPLAY_PER_SECOND = 20.0  # as `oncebox dlq replay --all` by default

Plan = ReplayPlan | DiscardPlan


@dataclass
class Batch:
    id: str
    verb: Literal["replay", "discard"]
    user: str
    planned: int
    started: float
    done: list[ActionOutcome] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    finished: bool = False
    failure: str | None = None

    @property
    def left(self) -> int:
        return self.planned - len(self.done) - len(self.skipped)


class Batches:
    def __init__(self, box: Box) -> None:
        self.box = box
        self._plans: dict[str, tuple[str, Plan]] = {}  # plan id -> (session id, plan)
        self._batches: dict[str, Batch] = {}
        self._lock = threading.Lock()

    def keep(self, session_id: str, plan: Plan) -> str:
        plan_id = secrets.token_urlsafe(16)
        with self._lock:
            while len(self._plans) >= PLANS_KEPT:
                self._plans.pop(next(iter(self._plans)))
            self._plans[plan_id] = (session_id, plan)
        return plan_id

    def take(self, session_id: str, plan_id: str) -> Plan | None:
        """The plan, once, to the session that made it; None when unknown, expired or taken."""
        with self._lock:
            kept = self._plans.get(plan_id)
            if kept is None or kept[0] != session_id:
                return None
            del self._plans[plan_id]
            return kept[1]

    def start(self, plan: Plan, *, user: str, reason: str) -> Batch:
        """Run the plan in a thread of its own; the batch's record fills as it goes."""
        verb: Literal["replay", "discard"] = "replay" if isinstance(plan, ReplayPlan) else "discard"
        batch = Batch(secrets.token_urlsafe(12), verb, user, plan.count, monotonic())
        with self._lock:
            self._batches[batch.id] = batch

        def each(outcome: ActionOutcome | Skipped) -> None:
            with self._lock:
                if isinstance(outcome, Skipped):
                    batch.skipped.append(outcome)
                else:
                    batch.done.append(outcome)

        def run() -> None:
            try:
                if isinstance(plan, ReplayPlan):
                    self.box.replay_planned(
                        plan, reason=reason, actor=user, per_second=REPLAY_PER_SECOND, on_each=each
                    )
                else:
                    self.box.discard_planned(plan, reason=reason, actor=user, on_each=each)
            except OnceboxError as exc:  # the store went away mid-batch: say where it stopped
                batch.failure = str(exc)
            finally:
                batch.finished = True

        threading.Thread(target=run, name=f"console-{verb}", daemon=True).start()
        return batch

    def get(self, batch_id: str) -> Batch | None:
        with self._lock:
            return self._batches.get(batch_id)
