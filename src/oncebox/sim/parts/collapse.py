"""A debounced task and a throttled one: enqueues of one customer within a window collapse into
one pending job.

- `preview(customer, edit)`: `Debounce(10 s, by="{customer}", max_wait=1 min)`;
- `digest(customer, edit)`: `Throttle(20 s, by="{customer}")`;
- actor: `enqueue-collapsed`, bursts of up to three enqueues of one task for one of two
  customers.

What must hold, after every step:

    K1  at most one pending job per debounce key: of each task's jobs for one customer, at most
        one is ready and was never leased (told by the job's row and arguments, not by the
        `debounce_key` the store keeps)
    K2  every enqueue is accounted for: it joined a pending job (the durable `enqueue_collapsed`)
        or made one (a row) — so those two together are at least the enqueues that returned,
        and at most the enqueues begun (one that crashed may or may not have written). The
        counter is every task's: the joins another part's enqueues committed (the limits
        part's `export-latest`, PostgreSQL) are taken out (`collapsed_elsewhere`)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import timedelta

from oncebox.jobs.debounce import Debounce, Throttle
from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Part, Rows, Stage, Starter, args_of

CUSTOMERS = 2
TASKS = ("preview", "digest")


class Collapsing(Part):
    """See the module docstring."""

    name = "collapse"

    def __init__(self, world: Stage) -> None:
        self.world = world
        self.begun = 0
        self.returned = 0
        box = world.box

        @box.task(
            name="preview",
            debounce=Debounce(
                timedelta(seconds=10), by="{customer}", max_wait=timedelta(minutes=1)
            ),
        )
        def preview(ctx: JobContext, customer: int, edit: int) -> None:
            pass

        @box.task(name="digest", throttle=Throttle(timedelta(seconds=20), by="{customer}"))
        def digest(ctx: JobContext, customer: int, edit: int) -> None:
            pass

        self.tasks = (preview, digest)

    def actors(self) -> Mapping[str, Starter]:
        return {"enqueue-collapsed": lambda: self.world.loop(self._enqueue)}

    def _enqueue(self) -> None:
        """A burst: up to three enqueues of one task for one customer, one after the other."""
        choices = self.world.choices
        task = self.tasks[choices.below(len(self.tasks))]
        customer = choices.below(CUSTOMERS)
        for _ in range(1 + choices.below(3)):
            self.begun += 1
            self.world.box.enqueue(task, customer=customer, edit=self.begun)
            self.returned += 1

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        listed = ", ".join(f"'{task}'" for task in TASKS)
        jobs = rows(
            "SELECT id, task, args, state, leased_at FROM oncebox_all_jobs "
            f"WHERE task IN ({listed})"
        )
        found = []
        pending = Counter(
            (task, args_of(args)["customer"])
            for _, task, args, state, leased_at in jobs
            if state == "ready" and leased_at is None
        )
        for (task, customer), count in sorted(pending.items()):
            if count > 1:
                ids = sorted(
                    int(i)
                    for i, t, a, s, at in jobs
                    if t == task
                    and args_of(a)["customer"] == customer
                    and s == "ready"
                    and at is None
                )
                found.append(
                    Violation("K1", f"{task} for customer {customer}: {count} pending jobs {ids}")
                )
        [(collapsed,)] = rows(
            "SELECT coalesce(sum(value), 0) FROM oncebox_counters WHERE name = 'enqueue_collapsed'"
        )
        accounted = int(collapsed) - self.world.collapsed_elsewhere + len(jobs)
        if not self.returned <= accounted <= self.begun:
            found.append(
                Violation(
                    "K2",
                    f"{self.returned} enqueues returned ({self.begun} begun), but "
                    f"{collapsed} joined a pending job ({self.world.collapsed_elsewhere} of "
                    f"them another part's) and {len(jobs)} made one",
                )
            )
        return found
