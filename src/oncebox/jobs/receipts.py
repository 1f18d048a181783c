"""A key's receipt chain: everything the store holds about one business operation.

The intent (the durable claim), every job that carried the key with each attempt, every message
written under it with each delivery attempt and the provider's receipt, and every operator action
on it from the audit log — in the order they happened. It is what the runbook asks an operator to
read before a replay, and what the console's key page shows.
"""

from __future__ import annotations

from dataclasses import dataclass

from oncebox.jobs.keys import validate_key
from oncebox.store.params import AuditFilter
from oncebox.store.protocol import Store
from oncebox.store.records import (
    AttemptRow,
    AuditRow,
    DeliveryAttemptRow,
    IntentRow,
    JobRow,
    OutboxRow,
)

AUDIT_SHOWN = 200


@dataclass(frozen=True)
class JobReceipts:
    job: JobRow
    attempts: list[AttemptRow]


@dataclass(frozen=True)
class MessageReceipts:
    message: OutboxRow
    attempts: list[DeliveryAttemptRow]


@dataclass(frozen=True)
class ReceiptChain:
    key: str
    intent: IntentRow | None
    jobs: list[JobReceipts]
    messages: list[MessageReceipts]
    audit: list[AuditRow]  # newest first, at most AUDIT_SHOWN

    @property
    def empty(self) -> bool:
        return self.intent is None and not self.jobs and not self.messages and not self.audit


def receipt_chain(store: Store, key: str) -> ReceiptChain:
    """The chain for `key` (a job's key, or a message's own key); an invalid key is a
    ConfigurationError, an unknown one an empty chain."""
    intent_key = validate_key(key.split("~", 1)[0])
    jobs = [JobReceipts(j, store.job_attempt_list(j.id)) for j in store.job_find_by_key(intent_key)]
    messages = [
        MessageReceipts(m, store.delivery_attempt_list(m.id)) for m in store.outbox_find_by_key(key)
    ]
    audit = store.audit_search(AuditFilter(key=key, limit=AUDIT_SHOWN))
    return ReceiptChain(key, store.intent_get(intent_key), jobs, messages, audit)
