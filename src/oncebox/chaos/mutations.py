"""Switches that break a guarantee on purpose, to prove the harness notices.

A checker that never fails proves nothing. Each mutation removes one mechanism oncebox's
guarantee rests on, in every process of a run, and names the scenario that must then fail:

    no-lease-fence     settlements and the send marker stop checking the lease token
                       → `slow-consumer-past-lease` fails (a superseded worker commits)
    ack-before-commit  a job is acknowledged (done) when leased, before its transaction commits
                       → `kill-consumer.after_claim_insert` fails (the digest is lost)
    no-unique-index    the claim is a plain insert and the intents table loses its primary key
                       → `concurrent-consumers` fails (two intents for one key)
    period-%Y          the weekly period is formatted with %Y (calendar year) instead of the
                       ISO year → `iso-week-boundary` fails (a wrong, colliding period)
    new-token-on-replay  a redriven message gets a new token (a new idempotency key): the
                       replay-under-a-new-key bug → `redrive-after-hours` fails (S11: the provider
                       takes tokens of no eligible key; L2: the keys' own tokens never arrive)
    ignore-window      the provider's idempotency window is never past: an unknown outcome is
                       resent under the same key however late → `resend-past-window` fails
                       (S5: the provider had forgotten the key and delivers a second copy)

They exist only for the harness's own tests (`oncebox chaos --mutation NAME`); nothing else can
switch them on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from oncebox.errors import ConfigurationError
from oncebox.jobs.periods import PeriodKind, iso_week
from oncebox.queue.transport import Delivery, TableTransport
from oncebox.store.base import JobFinish


@dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str
    must_fail: str  # the scenario that must fail with it


MUTATIONS = {
    m.name: m
    for m in (
        Mutation("no-lease-fence", "the lease-token fence", "slow-consumer-past-lease"),
        Mutation(
            "ack-before-commit", "acknowledgement after commit", "kill-consumer.after_claim_insert"
        ),
        Mutation("no-unique-index", "the unique claim", "concurrent-consumers"),
        Mutation("period-%Y", "ISO-year periods", "iso-week-boundary"),
        Mutation("new-token-on-replay", "replay under the same key", "redrive-after-hours"),
        Mutation("ignore-window", "the idempotency window", "resend-past-window"),
    )
}
# What a mutation replaced in this process, to put back after the run (module, name, value).
_PATCHED: list[tuple[Any, str, Any]] = []


def _patch(module: Any, name: str, value: Any) -> None:
    _PATCHED.append((module, name, getattr(module, name)))
    setattr(module, name, value)


# Query rewrites per dialect: (query name, text that must be there, what replaces it). A rewrite
# whose text is missing is an error, so a refactor cannot silently turn a mutation into a no-op.
_FENCES = {
    "postgres": (
        (
            "job_finish",
            "j.id = i.id AND j.lease_token = %(token)s",
            "j.id = i.id AND j.state = 'leased'",
        ),
        ("outbox_mark_sending", "lease_token = %(token)s AND ", ""),
        (
            "outbox_finish",
            "o.id = i.id AND o.lease_token = %(token)s",
            "o.id = i.id AND o.state IN ('leased', 'sending')",
        ),
    ),
    "sqlite": (
        ("job_finish", "j.lease_token = :token AND ", ""),
        ("outbox_mark_sending", "lease_token = :token AND ", ""),
        ("outbox_finish", "o.lease_token = :token AND ", ""),
    ),
}
_REPLAY = {
    "postgres": (("outbox_replay", "rescues = 0\n", "rescues = 0, token = o.token || '-again'\n"),),
    "sqlite": (("outbox_replay", "rescues = 0\n", "rescues = 0, token = token || '-again'\n"),),
}
_CLAIM = {
    "postgres": (("intent_claim", "ON CONFLICT (key) DO NOTHING", ""),),
    "sqlite": (("intent_claim", "ON CONFLICT (key) DO NOTHING", ""),),
}


def check(names: tuple[str, ...]) -> None:
    unknown = [name for name in names if name not in MUTATIONS]
    if unknown:
        raise ConfigurationError(
            f"unknown mutation {unknown[0]!r}; known: {', '.join(sorted(MUTATIONS))}"
        )


def wrong_iso_week() -> PeriodKind:
    """The classic bug: `%Y` is the calendar year, but ISO week numbers belong to the ISO year
    (2025-12-29 is 2026-W01, which %Y calls 2025-W01)."""

    def of(instant: datetime) -> str:
        return instant.strftime("%Y-W%V")

    return PeriodKind(iso_week.name, of, iso_week.check)


def apply_to_store(store: Any, names: tuple[str, ...]) -> None:
    """Rewrite this process's copy of the store's queries."""
    queries: dict[str, str] = store._q  # a test switch reaches inside, on purpose
    rewrites: list[tuple[str, str, str]] = []
    if "no-lease-fence" in names:
        rewrites += _FENCES[store.dialect]
    if "no-unique-index" in names:
        rewrites += _CLAIM[store.dialect]
    if "new-token-on-replay" in names:
        rewrites += _REPLAY[store.dialect]
    for query, old, new in rewrites:
        if old not in queries[query]:
            raise RuntimeError(f"mutation cannot find {old!r} in query {query}: update it")
        queries[query] = queries[query].replace(old, new)
    if "ack-before-commit" in names:
        _install_ack_on_receipt()
    if "ignore-window" in names:
        from oncebox.outbox import delivery_rescuer, dispatcher  # noqa: PLC0415

        for module in (dispatcher, delivery_rescuer):
            _patch(module, "past_window", lambda *_args: False)


def drop_unique_claim(conn: Any, dialect: str) -> None:
    """Schema part of `no-unique-index`, run once per run database."""
    if dialect == "postgres":
        conn.execute("ALTER TABLE oncebox_intents DROP CONSTRAINT oncebox_intents_pkey")
    else:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(oncebox_intents)")]
        listed = ", ".join(columns)
        conn.execute("CREATE TABLE oncebox_intents_copy AS SELECT * FROM oncebox_intents")
        conn.execute("DROP TABLE oncebox_intents")
        conn.execute(f"CREATE TABLE oncebox_intents AS SELECT {listed} FROM oncebox_intents_copy")
        conn.execute("DROP TABLE oncebox_intents_copy")
    conn.commit()


def undo_process_wide() -> None:
    """Put back what a mutation replaced in this process (the harness runs many scenarios in
    one process; a worker process simply exits)."""
    while _PATCHED:
        module, name, value = _PATCHED.pop()
        setattr(module, name, value)


def _install_ack_on_receipt() -> None:
    """Celery's default (`acks_late=False`): a job is done the moment it is received."""
    from oncebox.lanes import assembly  # noqa: PLC0415

    class AckOnReceipt(TableTransport):
        def fetch(self, limit: int) -> list[Delivery]:
            deliveries = super().fetch(limit)
            if deliveries:
                token = deliveries[0].lease_token or ""
                finishes = [
                    JobFinish(id=d.job_id or 0, state="done", outcome="completed")
                    for d in deliveries
                ]
                with self._session.transaction() as tx:
                    tx.job_finish(token, finishes)
            return deliveries

        def settle_in_transaction(self, tx: Any, settlements: Any) -> set[str]:
            return {s.delivery.message_id for s in settlements}

    _patch(assembly, "TableTransport", AckOnReceipt)
