"""A limited task: one job at a time per partition, and a rate, shared by every consumer.

- `export(tenant, n)`, keyed `export/{tenant}/{n}`, partitioned by `{tenant}` with
  `Concurrency(1, per_partition=True)` and `Rate("3/min", per_partition=True)`; its handler
  returns, or fails (a retry, which spends another token);
- actor: `enqueue-limited`, up to three jobs at once, each of one of two tenants;
- in one world in two (its variant, by the seed), a rolling deploy: a worker of the release
  before `export` was limited runs beside the world's consumers, `old-consumer` and
  `old-rescuer` (`rolling.py`), while the world's consumers, the new release's, declare the
  limit with every beat.
- PostgreSQL also: `export-latest(tenant, n)`, keyed `export-latest/{tenant}/{n}`, under the
  same limits (shared by name: its jobs and `export`'s count and spend together),
  `Throttle(1 s, by="{tenant}", keep="first")` and priority 1 (a tenant's pending one is leased
  first); actor `latest-in-tx`: one enqueue of it in the caller's transaction, held open across
  a yield point, then committed or rolled back. An enqueue that joins the tenant's pending job
  updates its row and holds it until the caller's transaction ends: a limited lease that chose
  that job passes over it (`SKIP LOCKED`), and must spend no token on it (R2). The rate holds
  jobs back longest late in a run, so the actor goes on for `QUIET_ROUNDS` rounds once faults
  stop. SQLite's lease holds the write lock from its choice on: it passes over nothing.

What must hold, after every step (the checker sees every lease: a lease is its own committed
store call, so its jobs are leased when the step that made it ends):

    R1  limits are never over-granted: the jobs leased now of each partition (of both tasks:
        their limits are one) are at most its concurrency (counted by the partition their key
        names, not by the `limit_key` the store wrote, so a job stripped of its partition still
        counts); and the leases seen, replayed through a token bucket of the rate's size, never
        take a token the bucket did not hold. Of the jobs the limits hold: in a rolling deploy,
        a job whose partition the old worker's rescuer took once no process had declared the
        limit within `LAPSE` is the old release's to run, without limits (`rolling.py`: the
        fence's own trade), and is not counted here or in R2
    R2  tokens are spent only on leases, and every lease spends one: each partition's bucket, as
        the store keeps it (`oncebox_limits`), holds what that replay says it holds
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from oncebox.jobs.debounce import Throttle
from oncebox.jobs.limits import Concurrency, Rate
from oncebox.jobs.retry import Retry
from oncebox.limits.rates import Limit as RateText
from oncebox.queue.context import JobContext
from oncebox.runtime.enqueue import EnqueueResult
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Body, Part, Rows, Stage, Starter, in_own_transaction, own_connection
from oncebox.sim.parts.rolling import ACTORS as OLD_ACTORS
from oncebox.sim.parts.rolling import OldRelease

TENANTS = 2
CONCURRENCY = 1
RATE = "3/min"
TASK = "export"
LATEST = "export-latest"  # PostgreSQL: throttled, enqueued in the caller's transaction
TASKS = (TASK, LATEST)
QUIET_ROUNDS = 8  # `latest-in-tx`'s requests once faults stop, before it stops too
EPSILON = 1e-6  # float arithmetic: the store's and the replay's differ in their last digits


@dataclass
class _Bucket:
    """The replay of one partition's bucket from the leases seen: its level after the last."""

    level: float
    at: datetime | None = None
    leases: list[str] = field(default_factory=list)  # for the evidence


class Limited(Part):
    """See the module docstring."""

    name = "limits"
    variants = 2  # 1: a rolling deploy, a worker of the release before the limit beside

    def __init__(self, world: Stage) -> None:
        self.world = world
        self.made = 0
        rate = RateText.parse(RATE)
        self.capacity = float(rate.count)
        self.refill_per_s = rate.refill_per_s
        self.seen: set[tuple[int, str]] = set()  # (job id, lease token): the leases seen
        self.buckets: dict[str, _Bucket] = {}
        choices = world.choices
        retry = Retry(
            max_attempts=3, base_delay=timedelta(seconds=1), max_delay=timedelta(seconds=5)
        )

        @world.box.task(
            name=TASK,
            key="export/{tenant}/{n}",
            partition="{tenant}",
            limits=[Concurrency(CONCURRENCY, per_partition=True), Rate(RATE, per_partition=True)],
            retry=retry,
        )
        def export(ctx: JobContext, tenant: int, n: int) -> None:
            if choices.below(8) == 0:
                raise RuntimeError("the export failed")

        self.export = export
        assert export.limits is not None
        [self.rate_name] = [name for limit, name in export.limits.rules if isinstance(limit, Rate)]
        self.postgres = world.real.dialect == "postgres"
        self.quiet_rounds: int | None = None  # counted once faults stop
        kept: tuple[str, ...] = ()
        if self.postgres:
            # the rate holds jobs back longest once the backlog has built, late in a run: the
            # caller's requests go on a while after faults stop, to meet the leases at work
            kept += ("latest-in-tx",)

            @world.box.task(
                name=LATEST,
                key="export-latest/{tenant}/{n}",
                partition="{tenant}",
                limits=[replace(limit, name=name) for limit, name in export.limits.rules],
                throttle=Throttle(timedelta(seconds=1), by="{tenant}", keep="first"),
                retry=retry,
                priority=1,
            )
            def export_latest(ctx: JobContext, tenant: int, n: int) -> None:
                pass

            self.latest = export_latest
        self.old: OldRelease | None = None
        if world.variant_of(Limited) == 1:
            self.old = OldRelease(world, TASK, "export/{tenant}/{n}", retry)
            kept += OLD_ACTORS
        self.keep = kept

    def actors(self) -> Mapping[str, Starter]:
        actors: dict[str, Starter] = {"enqueue-limited": lambda: self.world.loop(self._enqueue)}
        if self.postgres:
            actors["latest-in-tx"] = self._latest_in_tx
        if self.old is not None:
            actors.update(self.old.actors())
        return actors

    def time_passed(self) -> None:
        if self.old is not None:  # the new release's workers beat through the move
            self.old.beat()

    def _enqueue(self) -> None:
        """Up to three jobs at once, so that a backlog builds and the limits have work to hold
        back."""
        rows = []
        for _ in range(1 + self.world.choices.below(3)):
            self.made += 1
            rows.append({"tenant": self.world.choices.below(TENANTS), "n": self.made})
        self.world.box.enqueue_many(self.export, rows)
        self.world.wanted.update(f"export/{row['tenant']}/{row['n']}" for row in rows)

    def _latest_in_tx(self) -> Body:
        """One enqueue of `export-latest` in the caller's transaction, held open across a yield
        point (the row of the pending job it joined held), then committed or rolled back."""
        world = self.world
        state: dict[str, Any] = {}

        def round_() -> None:
            conn = own_connection(world, state)
            if self.quiet_rounds is not None:
                if self.quiet_rounds >= QUIET_ROUNDS:
                    return
                self.quiet_rounds += 1
            self.made += 1
            n, tenant = self.made, world.choices.below(TENANTS)

            def work() -> EnqueueResult:
                done = world.box.enqueue(self.latest, connection=conn, tenant=tenant, n=n)
                world.scheduler.point("latest.commit")
                return done

            committed, done = in_own_transaction(world, conn, work)
            if not committed:
                return
            if done.reason == "collapsed":
                world.collapsed_elsewhere += 1
            elif done.created:
                world.wanted.add(f"{LATEST}/{tenant}/{n}")

        return world.loop(round_)

    def faults_stop(self) -> None:
        self.quiet_rounds = 0

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        listed = ", ".join(f"'{task}'" for task in TASKS)
        leased = rows(
            "SELECT id, key, lease_token, leased_at FROM oncebox_all_jobs "
            f"WHERE task IN ({listed}) AND state = 'leased'"
        )
        if self.old is not None:  # the jobs the fence let go are no longer the limits' (R1)
            freed = self.old.freed_by_lapse(rows)
            leased = [row for row in leased if int(row[0]) not in freed]
        found: list[Violation] = []
        running = Counter(_partition(key) for _, key, _, _ in leased)
        for partition, count in sorted(running.items()):
            if count > CONCURRENCY:
                ids = sorted(int(i) for i, key, _, _ in leased if _partition(key) == partition)
                found.append(
                    Violation(
                        "R1",
                        f"{TASK} partition {partition}: {count} jobs leased at once {ids}, "
                        f"its concurrency is {CONCURRENCY}",
                    )
                )
        found += self._spent(leased)
        found += self._buckets(rows)
        return found

    def _spent(self, leased: list[Any]) -> list[Violation]:
        """The new leases, through each partition's bucket, in the order they were made."""
        new: dict[tuple[str, str], list[tuple[int, datetime]]] = {}
        for job_id, key, token, leased_at in leased:
            if (int(job_id), str(token)) in self.seen:
                continue
            self.seen.add((int(job_id), str(token)))
            new.setdefault((_partition(key), str(token)), []).append(
                (int(job_id), _instant(leased_at))
            )
        found = []
        for (partition, _token), jobs in sorted(new.items(), key=lambda item: item[1][0][1]):
            bucket = self.buckets.setdefault(partition, _Bucket(self.capacity))
            at = max(at for _, at in jobs)
            if bucket.at is not None:
                elapsed = max((at - bucket.at).total_seconds(), 0.0)
                bucket.level = min(self.capacity, bucket.level + elapsed * self.refill_per_s)
            bucket.at = at if bucket.at is None else max(bucket.at, at)
            bucket.level -= len(jobs)
            bucket.leases.append(f"{[j for j, _ in jobs]}@{at:%H:%M:%S}")
            if bucket.level < -EPSILON:
                found.append(
                    Violation(
                        "R1",
                        f"{TASK} partition {partition}: leases {', '.join(bucket.leases[-4:])} "
                        f"took more than the rate {RATE} holds ({bucket.level:.3f} tokens left)",
                    )
                )
        return found

    def _buckets(self, rows: Rows) -> list[Violation]:
        found = []
        stored = {
            str(partition): float(tokens)
            for partition, tokens in rows(
                f"SELECT partition, tokens FROM oncebox_limits WHERE name = '{self.rate_name}'"
            )
            if tokens is not None
        }
        for partition in sorted(set(stored) | set(self.buckets)):
            bucket = self.buckets.get(partition)
            spent_on = self.capacity if bucket is None else bucket.level
            kept = stored.get(partition, self.capacity)
            if abs(kept - spent_on) > EPSILON:
                leases = "none" if bucket is None else ", ".join(bucket.leases[-4:])
                found.append(
                    Violation(
                        "R2",
                        f"{TASK} partition {partition}: its bucket holds {kept:.3f} tokens, the "
                        f"leases seen ({leases}) leave {spent_on:.3f}",
                    )
                )
        return found


def _partition(key: str) -> str:
    """The partition a job's key names (`export/{tenant}/{n}`), as `{tenant}` renders it."""
    return key.split("/")[1]


def _instant(value: Any) -> datetime:
    """A stored instant as a datetime, whichever store wrote it (SQLite: microseconds)."""
    if isinstance(value, datetime):
        return value
    return datetime.fromtimestamp(int(value) / 1_000_000, tz=UTC)
