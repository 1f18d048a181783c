"""The lease of limited jobs, as both stores run it: the statements' parameters and rows as the
allocation (`store/allocation.py`) reads them. The statements themselves are in jobs.sql
(`job_limited_*`, `job_lease_limited`) and limits.sql (`limit_lock`, `limit_spend`); each
store sends them in its own lease transaction, in the order that module describes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from oncebox.store.allocation import Ask, Bucket, Candidate, Choice, Spend, Survey
from oncebox.store.params import LimitPlan
from oncebox.store.rows import Decode, Result

# The survey's statements, in the order a lease sends them (limit_lock first: the rest read
# after its locks are granted).
SURVEY = ("limit_lock", "job_limited_partitions", "job_limited_leased", "job_limited_next_due")


def split(plan: LimitPlan, tasks: Sequence[str]) -> tuple[list[str], list[str]]:
    """The tasks a lease takes through the limits, and those no limit holds."""
    return [t for t in tasks if t in plan.tasks], [t for t in tasks if t not in plan.tasks]


def survey_params(plan: LimitPlan, limited: Sequence[str]) -> dict[str, list[str]]:
    """Parameters of `limit_lock`, `job_limited_partitions`, `job_limited_leased` and
    `job_limited_next_due`, by name (each statement takes the ones it names)."""
    return {
        "names": sorted(plan.rules),
        "tasks": list(limited),
        "rates": sorted(
            rule.name
            for rule in plan.rules.values()
            if rule.per_partition and rule.capacity is not None
        ),
        "counted": sorted(
            {task for rule in plan.rules.values() if rule.concurrency for task in rule.tasks}
        ),
    }


def survey_of(now: datetime, reads: Sequence[Result], decode: Decode) -> Survey:
    """The survey from the results of the `SURVEY` statements, in that order."""
    lock, parts, leased, due = reads
    buckets: dict[tuple[str, str], Bucket] = {}
    for row in _dicts(lock):
        _bucket(buckets, row["name"], "", row, decode)
    partitions: dict[tuple[str, str], None] = {}
    for row in _dicts(parts):
        partitions.setdefault((row["task"], row["partition"]), None)
        if row["name"] is not None:
            _bucket(buckets, row["name"], row["partition"], row, decode)
    in_use = {(row["task"], row["partition"]): int(row["leased"]) for row in _dicts(leased)}
    next_at = {row["task"]: decode(row["at"]) for row in _dicts(due)}
    return Survey(
        now, list(partitions), in_use, buckets, {t: at for t, at in next_at.items() if at}
    )


def candidates_params(asks: Sequence[Ask], queues: Sequence[str]) -> dict[str, Any]:
    return {"asks": json.dumps([[a.task, a.partition, a.count] for a in asks]), "queues": queues}


def candidates_of(result: Result, decode: Decode) -> list[Candidate]:
    found = []
    for row in _dicts(result):
        run_at = decode(row["run_at"])
        assert run_at is not None
        found.append(
            Candidate(int(row["id"]), row["task"], row["partition"], int(row["priority"]), run_at)
        )
    return found


def picks_json(choice: Choice) -> str:
    """`job_lease_limited`'s picks: [id, the partition it was counted in]."""
    return json.dumps([[job_id, partition] for job_id, partition in choice.picks])


def spends_json(spends: Sequence[Spend], encode: Any) -> str:
    """`limit_spend`'s rows: [name, partition, level, at, [the jobs it charges if leased]];
    `encode` writes an instant as the store keeps it."""
    return json.dumps(
        [[s.name, s.partition, s.level, encode(s.updated_at), list(s.jobs)] for s in spends]
    )


def _bucket(
    into: dict[tuple[str, str], Bucket],
    name: str,
    partition: str,
    row: dict[str, Any],
    decode: Decode,
) -> None:
    updated = decode(row["updated_at"])
    if row["tokens"] is not None and updated is not None:
        into[(name, partition)] = Bucket(float(row["tokens"]), updated)


def _dicts(result: Result) -> list[dict[str, Any]]:
    columns = result.columns()
    return [{name: row[at] for name, at in columns.items()} for row in result.rows]
