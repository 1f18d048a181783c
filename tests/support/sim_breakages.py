"""Breakages the simulation must catch that no chaos mutation makes: each patches, for the test
that calls it, one mechanism a jobs-side invariant watches (docs/simulation.md lists the seeds)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from oncebox.jobs.debounce import Collapse
from oncebox.store import allocation, sqlfiles, sqlite
from oncebox.store.sqlite import SqliteStore


def rewrite(monkeypatch: pytest.MonkeyPatch, query: str, old: str, new: str) -> None:
    """Every SQLite store opened meanwhile runs `query` with `old` replaced by `new`."""
    load = sqlfiles.load_queries

    def rewritten(dialect: str) -> dict[str, str]:
        queries = load(dialect)
        assert old in queries[query], f"{query} no longer holds {old!r}: update the test"
        queries[query] = queries[query].replace(old, new)
        return queries

    monkeypatch.setattr(sqlite, "load_queries", rewritten)


def unlimited_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease no longer counts the slots in use: every partition has all its room."""

    monkeypatch.setattr(allocation, "_used", lambda plan, leased: {})


def bucket_never_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease reads every bucket as full, whatever was spent from it."""

    monkeypatch.setattr(allocation, "_level", lambda rule, bucket, now: rule.capacity)


def spent_without_a_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """A limited lease spends one token more than it leased jobs."""
    rewrite(monkeypatch, "limit_spend", "level - leased, at", "level - leased - 1, at")


def a_debounce_key_per_enqueue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each enqueue renders a debounce key of its own: nothing collapses."""
    count = itertools.count()
    key_of = Collapse.key_of

    def apart(self: Collapse, task: str, args: Any) -> str:
        return f"{key_of(self, task, args)}/{next(count)}"

    monkeypatch.setattr(Collapse, "key_of", apart)


def collapse_uncounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """An enqueue that joins a pending job is no longer counted."""
    rewrite(
        monkeypatch,
        "job_merge__count",
        "VALUES ('enqueue_collapsed', 0, 1)",
        "VALUES ('enqueue_collapsed', 0, 0)",
    )


def heads_out_of_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease waits only for a group's leased job, not for its earlier ready ones."""
    rewrite(
        monkeypatch,
        "job_lease",
        "AND (g.state = 'leased' OR g.id < j.id)",
        "AND g.state = 'leased'",
    )


def caller_committed_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """An enqueue on the caller's connection commits the caller's transaction."""

    insert = SqliteStore._insert_job

    def committing(self: SqliteStore, params: dict[str, Any], connection: object | None) -> Any:
        inserted = insert(self, params, connection)
        if connection is not None:
            connection.commit()  # type: ignore[attr-defined]
        return inserted

    monkeypatch.setattr(SqliteStore, "_insert_job", committing)


def settled_counted_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A settlement adds two to its counter."""
    rewrite(monkeypatch, "job_finish__count", "       0, count(*)", "       0, 2 * count(*)")


def young_jobs_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pruner takes finished jobs however recently they finished."""
    rewrite(monkeypatch, "job_prune", "AND j.finished_at < :now - :older_than_us", "")


def unsent_jobs_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pruner takes a finished job whose message is still to be sent."""
    rewrite(
        monkeypatch,
        "job_prune",
        "AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o\n                      WHERE o.job_id = "
        "j.id AND o.state <> 'sent' AND o.discarded_at IS NULL)",
        "",
    )


def kept_answers_pruned_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's pruner takes every answered Idempotency-Key record, expired or not."""
    rewrite(
        monkeypatch,
        "api_request_prune",
        "WHERE expires_at <= :now\n    ORDER BY",
        "WHERE status IS NOT NULL\n    ORDER BY",
    )


def stale_owner_extends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fan-out's batch extends its run whoever owns it now (the owner fence dropped)."""
    rewrite(
        monkeypatch,
        "schedule_run_extend",
        "WHERE schedule = :schedule AND period = :period AND owner = :owner AND state = 'running'",
        "WHERE schedule = :schedule AND period = :period AND state = 'running'",
    )


def claimed_while_leased(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheduler claims a running fan-out whatever its lease (the lease fence dropped)."""
    rewrite(
        monkeypatch,
        "schedule_run_claim",
        "WHERE (r.state = 'running' AND r.lease_expires_at < excluded.started_at)",
        "WHERE (r.state = 'running')",
    )


def rescued_before_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease rescuer takes a job's lease up to ten minutes before it runs out."""
    rewrite(
        monkeypatch,
        "job_rescue_expired",
        "lease_expires_at < :now",
        "lease_expires_at < :now + 600000000",
    )
