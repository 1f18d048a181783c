"""An ordered task: the jobs of one group run one at a time, in the order they were enqueued.

- `step(account, n)`, `group_by="account"`: its handler returns, or fails (a retry: the job
  stays its group's head) or, rarely, fails for good (dead: its group moves on);
- actor: `enqueue-ordered`, up to three jobs at once, each for one of two accounts.

What must hold, after every step (a lease is its own committed store call: the checker sees it
when the step that made it ends):

    O1  one head per ordered group, in enqueue order: at most one job of a group is leased at
        any instant; a job is leased only while no earlier job (a lower id) of its group is
        ready or leased; and a job completes only while no earlier one of its group waits,
        unless that one was brought back by a person (replayed, after it had died)

A group is told by the job's arguments, not by the `group_key` the store wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from oncebox.jobs.retry import Retry
from oncebox.kernel.errors import Permanent
from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Part, Rows, Stage, Starter, args_of

ACCOUNTS = 2
TASK = "step"
WAITING = ("ready", "leased")


class Ordered(Part):
    """See the module docstring."""

    name = "ordered"

    def __init__(self, world: Stage) -> None:
        self.world = world
        self.made = 0
        self.leases: set[tuple[int, str]] = set()  # (job id, lease token) seen
        self.done: set[int] = set()
        choices = world.choices
        retry = Retry(
            max_attempts=3, base_delay=timedelta(seconds=1), max_delay=timedelta(seconds=5)
        )

        @world.box.task(name=TASK, group_by="account", retry=retry)
        def step(ctx: JobContext, account: int, n: int) -> None:
            roll = choices.below(16)
            if roll == 0:
                raise RuntimeError("the step failed")
            if roll == 1:
                raise Permanent("the step refused for good")

        self.step = step

    def actors(self) -> Mapping[str, Starter]:
        return {"enqueue-ordered": lambda: self.world.loop(self._enqueue)}

    def _enqueue(self) -> None:
        """Up to three jobs at once: a batch's jobs are ordered as they are listed."""
        rows = []
        for _ in range(1 + self.world.choices.below(3)):
            self.made += 1
            rows.append({"account": self.world.choices.below(ACCOUNTS), "n": self.made})
        self.world.box.enqueue_many(self.step, rows)

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        jobs = rows(
            f"SELECT id, args, state, lease_token FROM oncebox_all_jobs WHERE task = '{TASK}'"
        )
        groups: dict[Any, list[tuple[int, str, str | None]]] = {}
        for job_id, args, state, token in jobs:
            groups.setdefault(args_of(args)["account"], []).append((int(job_id), str(state), token))
        replayed: set[int] | None = None
        found = []
        for account, members in sorted(groups.items()):
            members.sort()
            leased = [job_id for job_id, state, _ in members if state == "leased"]
            if len(leased) > 1:
                found.append(
                    Violation("O1", f"{TASK} group {account}: {len(leased)} heads leased {leased}")
                )
            for job_id, state, token in members:
                earlier = [i for i, s, _ in members if i < job_id and s in WAITING]
                if state == "leased" and (job_id, str(token)) not in self.leases:
                    self.leases.add((job_id, str(token)))
                    if earlier:
                        found.append(
                            Violation(
                                "O1",
                                f"{TASK} group {account}: job {job_id} was leased while "
                                f"earlier jobs {earlier} still waited",
                            )
                        )
                if state == "done" and job_id not in self.done:
                    self.done.add(job_id)
                    if earlier and replayed is None:
                        replayed = self._replayed(rows)
                    late = [i for i in earlier if replayed is None or i not in replayed]
                    if late:
                        found.append(
                            Violation(
                                "O1",
                                f"{TASK} group {account}: job {job_id} completed before the "
                                f"earlier jobs {late}",
                            )
                        )
        return found

    @staticmethod
    def _replayed(rows: Rows) -> set[int]:
        return {
            int(target)
            for (target,) in rows(
                "SELECT target_id FROM oncebox_audit "
                "WHERE target_kind = 'job' AND action = 'replay'"
            )
        }
