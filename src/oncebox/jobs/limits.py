"""Limits on tasks: how many of a task's jobs may be leased at once, and how fast they may start.

    @box.task(key="export/{tenant_id}/{export_id}", partition="{tenant_id}",
              limits=[oncebox.Concurrency(8),                    # all tenants together
                      oncebox.Concurrency(2, per_partition=True),  # each tenant
                      oncebox.Rate("100/min", per_partition=True)])

- `Concurrency(n)`: at most `n` jobs leased at once. A lease is the slot: it is taken when the
  job is leased and given back when the job settles, is released, or its lease runs out and is
  rescued (a SIGKILLed worker's slot frees when the rescuer ends its lease).
- `Rate("100/min")`: a token bucket (`outbox/ratelimit.py`'s, as the channels use): at most
  `count` leases at once, refilled at `count / period`; each lease of a job spends a token, a
  retry spends another.
- `per_partition=True`: one slot count or bucket per value of the task's `partition` template,
  rendered from the job's arguments at enqueue (the rules of a key: `jobs/keys.py`); otherwise
  one for the whole task.
- `name=`: a limit given the same name on several tasks is one limit shared by them (its count
  is over all their jobs, a partition over all their jobs with that partition text) — the way
  to limit a queue, or calls to one provider from several tasks. Unnamed, a limit is the
  task's own. A worker counts the slots of the tasks it has declared: every worker must
  declare every task that shares a limit.

The store enforces them in the lease (`store/allocation.py`), so every worker on every host
shares them; a job held back waits `ready`, without spending an attempt, outside the index the
unlimited jobs are leased from. Each process records the limits its code declares
(`jobs/declarations.py`): a worker of a release without a task's limit leaves the task's
limited jobs alone while another release still declares it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oncebox.jobs.keys import KeyTemplate, argument_template
from oncebox.kernel.errors import ConfigurationError, InvalidKey
from oncebox.limits.rates import Limit as RateText
from oncebox.store.params import LimitPlan, LimitRule

MAX_CONCURRENCY = 100_000


@dataclass(frozen=True)
class Concurrency:
    """At most `limit` jobs leased at once (per partition with `per_partition=True`)."""

    limit: int
    per_partition: bool = False
    name: str | None = None


@dataclass(frozen=True)
class Rate:
    """At most `limit` (``"COUNT/PERIOD"``, e.g. ``"100/min"``) leases: a bucket of COUNT
    tokens refilled at COUNT per PERIOD (per partition with `per_partition=True`)."""

    limit: str
    per_partition: bool = False
    name: str | None = None


TaskLimit = Concurrency | Rate


@dataclass(frozen=True)
class TaskLimits:
    """A task's limits and the partition template its per-partition limits use."""

    rules: tuple[tuple[TaskLimit, str], ...]  # each limit with its resolved name
    partition: KeyTemplate | None

    def declaration(self) -> str:
        """The limits as the store records a task's declaration of them (canonical JSON): the
        partition template and each limit's name and rule, as people wrote it."""
        rules = sorted([name, _rule(name, limit).shown] for limit, name in self.rules)
        source = None if self.partition is None else self.partition.source
        return json.dumps({"limits": rules, "partition": source}, separators=(",", ":"))

    def partition_of(self, task: str, args: Mapping[str, Any]) -> str:
        """The job's partition ('' when the task has none), as stored in `limit_key`."""
        if self.partition is None:
            return ""
        try:
            return self.partition.render(args)
        except InvalidKey as exc:
            raise InvalidKey(f"task {task!r}: partition: {exc}") from None


def task_limits(
    task: str,
    limits: Sequence[TaskLimit] | None,
    partition: str | None,
    parameters: set[str] | None,
) -> TaskLimits | None:
    """Check a task's `limits=` and `partition=` (`parameters`: the handler's, None when it takes
    **kwargs); every mistake is a `ConfigurationError`."""
    where = f"task {task!r}"
    if not limits:
        if partition is not None:
            raise ConfigurationError(f"{where}: partition= is used only by a per-partition limit")
        return None
    if isinstance(limits, (str, Concurrency, Rate)) or not isinstance(limits, Sequence):
        raise ConfigurationError(f"{where}: limits= must be a list, e.g. [oncebox.Concurrency(4)]")
    named: list[tuple[TaskLimit, str]] = []
    for limit in limits:
        _check(where, limit)
        name = limit.name or _own_name(task, limit)
        if any(name == other for _, other in named):
            raise ConfigurationError(f"{where}: two limits are both {name!r}")
        named.append((limit, name))
    template = None
    if partition is not None:
        template = argument_template(where, "partition", partition, parameters)
    partitioned = any(limit.per_partition for limit in limits)
    if partitioned and template is None:
        raise ConfigurationError(
            f"{where}: a per-partition limit needs partition=, e.g. partition='{{tenant_id}}'"
        )
    if template is not None and not partitioned:
        raise ConfigurationError(f"{where}: partition= is used only by a per-partition limit")
    return TaskLimits(tuple(named), template)


def _check(where: str, limit: object) -> None:
    if isinstance(limit, Concurrency):
        if isinstance(limit.limit, bool) or not isinstance(limit.limit, int):
            raise ConfigurationError(f"{where}: Concurrency({limit.limit!r}) needs an int")
        if not 1 <= limit.limit <= MAX_CONCURRENCY:
            raise ConfigurationError(
                f"{where}: Concurrency({limit.limit}) must be within 1..{MAX_CONCURRENCY}"
            )
    elif isinstance(limit, Rate):
        if not isinstance(limit.limit, str):
            raise ConfigurationError(f"{where}: Rate({limit.limit!r}) takes 'COUNT/PERIOD'")
        try:
            RateText.parse(limit.limit)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    else:
        raise ConfigurationError(
            f"{where}: {limit!r} is not a limit; use oncebox.Concurrency(n) or oncebox.Rate('n/s')"
        )
    if limit.name is not None and (
        not isinstance(limit.name, str) or not limit.name.strip() or limit.name.startswith("~")
    ):
        raise ConfigurationError(
            f"{where}: a limit's name must be a non-empty string not starting with '~' "
            "(reserved for oncebox's own rows)"
        )


def _own_name(task: str, limit: TaskLimit) -> str:
    scope = "/partition" if limit.per_partition else ""
    if isinstance(limit, Concurrency):
        return f"{task}:concurrency{scope}"
    return f"{task}:rate:{RateText.parse(limit.limit).name}{scope}"


def plan_of(declared: Mapping[str, TaskLimits]) -> LimitPlan:
    """The lease's plan for every limited task; a name shared by tasks must mean one limit."""
    rules: dict[str, LimitRule] = {}
    owners: dict[str, list[str]] = {}
    tasks: dict[str, tuple[str, ...]] = {}
    for task, limits in sorted(declared.items()):
        names = []
        for limit, name in limits.rules:
            rule = _rule(name, limit)
            seen = rules.get(name)
            if seen is not None and seen != rule:
                raise ConfigurationError(
                    f"limit {name!r} is declared differently by tasks {owners[name][0]!r} and "
                    f"{task!r}; a shared limit must be the same everywhere"
                )
            rules[name] = rule
            owners.setdefault(name, []).append(task)
            names.append(name)
        tasks[task] = tuple(sorted(names))
    shared = {
        name: LimitRule(
            rule.name,
            rule.concurrency,
            rule.capacity,
            rule.refill_per_s,
            rule.per_partition,
            tuple(sorted(owners[name])),
            rule.shown,
        )
        for name, rule in rules.items()
    }
    return LimitPlan(shared, tasks)


def _rule(name: str, limit: TaskLimit) -> LimitRule:
    scope = " per partition" if limit.per_partition else ""
    if isinstance(limit, Concurrency):
        shown = f"{limit.limit} at once{scope}"
        return LimitRule(name, limit.limit, None, None, limit.per_partition, (), shown)
    text = RateText.parse(limit.limit)
    return LimitRule(
        name,
        None,
        float(text.count),
        text.refill_per_s,
        limit.per_partition,
        (),
        f"{text.name}{scope}",
    )
