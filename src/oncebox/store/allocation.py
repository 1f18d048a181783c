"""How a lease shares out what the limits allow: which partitions may take how many jobs.

A lease of limited tasks runs in three steps, in one transaction that holds the lock on each of
its limits' rows (`limit_lock`: every lease of a limit waits for the one before it, so two can
never both see the same free slot):

1. the *survey* reads the partitions that have ready jobs (a skip scan: one probe per
   partition, never a read of the jobs waiting in them), the jobs each limited task has leased
   per partition, and the buckets' levels;
2. `asks` turns it into how many jobs each partition may take — the least room of its limits —
   and the store reads that many due candidates from each, in claim order;
3. `choose` takes candidates in claim order (priority, then due time, then id) while every limit
   of each still has room, says which rates' tokens each would spend, and when to look again;
   the store leases them and spends a token for each it leased (`Spend`).

A slot in use is a leased job, counted when the lease reads them: a job that settles, is
released or whose lease is rescued frees its slot with no bookkeeping that could drift. The
survey is read after the lock is granted, so it sees every lease committed before (PostgreSQL's
read committed takes a new snapshot per statement).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from oncebox.store.params import LimitPlan, LimitRule

Scope = tuple[str, str]  # (limit name, partition or '' for the limit as a whole)


@dataclass(frozen=True, slots=True)
class Bucket:
    tokens: float
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Survey:
    """What the first step read, under the limits' lock."""

    now: datetime
    partitions: Sequence[tuple[str, str]]  # (task, partition) with ready jobs
    leased: Mapping[tuple[str, str], int]  # (task, partition) -> jobs leased now
    buckets: Mapping[Scope, Bucket]  # a scope without a row has a full bucket
    next_at: Mapping[str, datetime] = field(default_factory=dict)  # per task: its next job due


@dataclass(frozen=True, slots=True)
class Ask:
    task: str
    partition: str
    count: int


@dataclass(frozen=True, slots=True)
class Candidate:
    id: int
    task: str
    partition: str
    priority: int
    run_at: datetime


@dataclass(frozen=True, slots=True)
class Spend:
    """A bucket this lease takes tokens from: its level before, and the chosen jobs each to be
    charged a token — if leased. The store charges in the lease's transaction, after the lease
    statement, for those its token holds: a chosen job the lease passed over (PostgreSQL skips
    a row another transaction has locked) costs nothing."""

    name: str
    partition: str
    level: float
    updated_at: datetime
    jobs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Choice:
    picks: list[tuple[int, str]]  # (job id, the partition it was counted in)
    spends: list[Spend]
    next_at: datetime | None  # when a held-back job may be leased, if a time says so


def scope_of(rule: LimitRule, partition: str) -> Scope:
    return (rule.name, partition if rule.per_partition else "")


@dataclass(slots=True)
class Rooms:
    """How many more leases each scope allows now, and when a rate's bucket next holds one."""

    left: dict[Scope, int]
    levels: dict[Scope, float]
    refill_at: dict[Scope, datetime]

    def of(self, plan: LimitPlan, task: str, partition: str) -> int:
        return min(self.left[scope_of(rule, partition)] for rule in plan.rules_of(task))


def rooms(plan: LimitPlan, survey: Survey) -> Rooms:
    used = _used(plan, survey.leased)
    result = Rooms({}, {}, {})
    for task, partition in survey.partitions:
        for rule in plan.rules_of(task):
            scope = scope_of(rule, partition)
            if scope in result.left:
                continue
            room = math.inf
            if rule.concurrency is not None:
                room = rule.concurrency - used.get(scope, 0)
            if rule.capacity is not None and rule.refill_per_s is not None:
                level = _level(rule, survey.buckets.get(scope), survey.now)
                result.levels[scope] = level
                room = min(room, math.floor(level))
                if level < 1.0:
                    wait = (1.0 - level) / rule.refill_per_s
                    result.refill_at[scope] = survey.now + timedelta(seconds=wait)
            result.left[scope] = max(int(room), 0)
    return result


def asks(
    plan: LimitPlan, survey: Survey, room: Rooms, limit: int, *, slots: int | None = None
) -> list[Ask]:
    """How many due jobs to read from each partition: its least room, at most `limit` (and
    `slots`, for a task whose jobs hold a slot)."""
    wanted = []
    for task, partition in survey.partitions:
        most = limit if slots is None or not holds_slot(plan, task) else min(limit, slots)
        count = min(most, room.of(plan, task, partition))
        if count > 0:
            wanted.append(Ask(task, partition, count))
    return wanted


def choose(
    plan: LimitPlan,
    survey: Survey,
    room: Rooms,
    candidates: Iterable[Candidate],
    limit: int,
    *,
    slots: int | None = None,
) -> Choice:
    """Candidates in claim order while every limit of each has room, up to `limit`, and at most
    `slots` of them holding a concurrency limit's slot.

    A consumer runs its batch in one transaction, one handler after another, so a slot leased
    in a batch is held while the handlers before it run: `slots` is how many the consumer can
    run within its transaction budget at the pace its handlers have run (`Consumer.slots`) —
    one while that pace is unknown or slow, so slow handlers hold a slot only while they run,
    and fast ones still lease in batches. What a budget cuts short goes back at once."""
    left = dict(room.left)
    taken: dict[Scope, list[int]] = {}
    picks: list[tuple[int, str]] = []
    held = 0
    for candidate in sorted(candidates, key=lambda c: (-c.priority, c.run_at, c.id)):
        if len(picks) >= limit:
            break
        scopes = [scope_of(rule, candidate.partition) for rule in plan.rules_of(candidate.task)]
        slot = holds_slot(plan, candidate.task)
        if (slot and slots is not None and held >= slots) or not all(
            left[scope] > 0 for scope in scopes
        ):
            continue
        held += slot
        picks.append((candidate.id, candidate.partition))
        for scope in scopes:
            left[scope] -= 1
            taken.setdefault(scope, []).append(candidate.id)
    spends = []
    for scope, jobs in sorted(taken.items()):
        level = room.levels.get(scope)
        if level is None:
            continue  # a slot count: the leased job itself is the record
        bucket = survey.buckets.get(scope)
        # never move a bucket's time back: the next lease would refill that interval again
        at = survey.now if bucket is None else max(survey.now, bucket.updated_at)
        spends.append(Spend(scope[0], scope[1], level, at, tuple(jobs)))
    # a job falling due later is worth waking for only while its task's whole limits have room
    # (its partition's are not known until then); with none, a settle frees a slot, not a time
    times = list(room.refill_at.values())
    for task, at in survey.next_at.items():
        whole = [(rule.name, "") for rule in plan.rules_of(task) if not rule.per_partition]
        if all(left.get(scope, 1) > 0 for scope in whole):
            times.append(at)
    return Choice(picks, spends, min(times, default=None))


def holds_slot(plan: LimitPlan, task: str) -> bool:
    """Whether a job of `task` takes a concurrency limit's slot while it is leased."""
    return any(rule.concurrency is not None for rule in plan.rules_of(task))


def _used(plan: LimitPlan, leased: Mapping[tuple[str, str], int]) -> dict[Scope, int]:
    """Slots in use per scope: leased jobs of every task that declares the limit."""
    used: dict[Scope, int] = {}
    for rule in plan.rules.values():
        if rule.concurrency is None:
            continue
        tasks = set(rule.tasks)
        for (task, partition), count in leased.items():
            if task in tasks:
                scope = scope_of(rule, partition)
                used[scope] = used.get(scope, 0) + count
    return used


def _level(rule: LimitRule, bucket: Bucket | None, now: datetime) -> float:
    assert rule.capacity is not None and rule.refill_per_s is not None
    if bucket is None:
        return rule.capacity
    elapsed = max((now - bucket.updated_at).total_seconds(), 0.0)
    return min(rule.capacity, bucket.tokens + elapsed * rule.refill_per_s)
