"""A rolling deploy in the limits part's worlds: a worker of the release before `export` was
limited runs beside the world's consumers, over the same store.

In one world in two of those holding the limits part (its variant, by the seed), the world's
consumers are the new release's workers and an old release's worker runs too. Its box declares
`export` with the same key and no limits, as the code before the limit did, and knows no other
task (a worker claims only the tasks it registered). It is started, and started again after a
crash, as `oncebox worker` starts one (`lanes/worker.py`): its code limits nothing, so it
declares nothing, and its lease rescuer's first pass comes at once. Each of its lanes is an
actor, kept in the quiet phase (an old worker runs until the deploy replaces it):

- `old-rescuer`: its lease rescuer (`unlimited=["export"]`), a pass a round. Each pass hands the
  ready jobs of every task it knows without limits back to the unlimited lease (`job_unlimit`),
  unless a process declared the task limited within `LAPSE` (`jobs/declarations.py`);
- `old-consumer`: its consumer lane, whose lease takes only `export`'s jobs without a partition.

The new release's workers declare `export`'s limits with every beat of their presence threads
(every 10 s, `Worker._presence`); here they beat through each move of the clock (`beat`, called
from `Part.time_passed`). So the new release's jobs stay limited, and the old worker finds none
it may lease. Without the fence (`unlimit-any-task`) its rescuer strips them whatever the new
release declares, and its consumer runs them at once, without a slot or a token: R1 or R2.

What the fence lets go is no over-grant: once no process has declared `export` limited for
`LAPSE`, the store can no more tell a limit removed by a deploy from one not yet deployed, and
the jobs freed then run as the release without the limit runs them (the trade the declarations
make, `jobs/declarations.py`). Beats keep that from happening while the new release's workers
live, but a beat waits for SQLite's write lock within the clock's step: a transaction that held
the lock through a move of ten minutes kept every beat out that long, as an outage of the store
would, and an old rescuer's pass may take the lock first, at the new time (a few worlds in 30
at 150 steps, about half at 400). `freed_by_lapse` names the jobs it freed; R1 and R2 judge
the rest, and the mutation strips them while the declaration is fresh.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from oncebox.box import Box
from oncebox.jobs.declarations import LAPSE, declaration_of
from oncebox.jobs.retry import Retry
from oncebox.lanes.assembly import build_consumer, build_lease_rescuer
from oncebox.lanes.consumer import ConsumerConfig
from oncebox.lanes.lease_rescuer import LeaseRescuerConfig
from oncebox.queue.context import JobContext
from oncebox.queue.watch import HandlerWatch
from oncebox.sim.parts import Body, Rows, Stage, Starter
from oncebox.sim.parts.retained import instant

ACTORS = ("old-consumer", "old-rescuer")
LEASE = timedelta(seconds=30)  # as the world's consumers lease


class OldRelease:
    """See the module docstring. `task`, `key` and `retry`: `export` as both releases name,
    key and retry it (its handler fails one run in eight, by choice, as the new one does)."""

    def __init__(self, world: Stage, task: str, key: str, retry: Retry) -> None:
        self.world = world
        self.task = task
        self.declared = declaration_of(world.box.registry.resolve(task))
        assert self.declared is not None, f"{task} is limited in the new release"
        self.box = Box(store=world.store, secret=world.box.runtime.secrets.get(), seed=1)
        choices = world.choices

        @self.box.task(name=task, key=key, retry=retry)
        def export(ctx: JobContext, tenant: int, n: int) -> None:
            if choices.below(8) == 0:
                raise RuntimeError("the export failed")

        self.partitioned: set[int] = set()  # jobs seen ready with a partition
        self.freed: set[int] = set()  # jobs whose partition the fence let go (`freed_by_lapse`)

    def actors(self) -> dict[str, Starter]:
        return {"old-consumer": self._consumer, "old-rescuer": self._rescuer}

    def _consumer(self) -> Body:
        runtime = self.box.runtime
        config = ConsumerConfig(
            batch_size=2, max_batch_size=2, lease=LEASE, lock_timeout=timedelta(hours=1)
        )

        def body() -> None:  # built in the actor's own thread, as a worker builds its lanes
            watch = HandlerWatch(exit_on_hang=False)
            consumer, _transport = build_consumer(runtime, config, watch, name="sim-old")
            self.world.loop(consumer.run_once)()

        return body

    def _rescuer(self) -> Body:
        runtime = self.box.runtime

        def body() -> None:
            self.world.loop(build_lease_rescuer(runtime, LeaseRescuerConfig(), {}).run_once)()

        return body

    def beat(self) -> None:
        """The new release's workers declare `export`'s limits through the clock's move, as
        their presence threads do every 10 s (`LimitDeclarations.declare_all`), on the store
        itself (the beat may wait its turn at SQLite's write lock)."""
        assert self.declared is not None
        self.world.real.limit_declare([self.declared])

    def freed_by_lapse(self, rows: Rows) -> set[int]:
        """The jobs of `export` that lost their partition while no process had declared the
        task limited within `LAPSE`, as the checker last saw the declaration: the fence let
        them go, and they are the release without the limit's to run. Read after every step:
        a job is stripped by a pass of its own, and leased in a later step."""
        ready = rows(
            "SELECT id, limit_key FROM oncebox_all_jobs "
            f"WHERE task = '{self.task}' AND state = 'ready'"
        )
        stripped = {int(i) for i, part in ready if part is None and int(i) in self.partitioned}
        if stripped and self._lapsed(rows):
            self.freed |= stripped
        self.partitioned = (self.partitioned - stripped) | {
            int(i) for i, part in ready if part is not None
        }
        return self.freed

    def _lapsed(self, rows: Rows) -> bool:
        found: list[Any] = rows(
            f"SELECT declared_at FROM oncebox_limit_declarations WHERE task = '{self.task}'"
        )
        declared = instant(found[0][0]) if found else None
        return declared is None or declared <= self.world.clock_now() - LAPSE
