"""The durable counters: one definition of each, shared by `oncebox status`, the Prometheus
exporter and the docs. They are kept in the store (`oncebox_counters`) and added to by the very
statements that do what they count — the enqueue, the consumer's settlement, the rescue, the
dispatcher's settlement (see `store/sql/*/counters.sql`) — so they are shared by every worker,
survive restarts and prunes, and never count what rolled back. `kernel/metrics.py` keeps a process's
own figures (store timings, leases lost) that have no transaction to ride in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: name -> what it counts. The order is the order `status` shows them in.
COUNTERS: dict[str, str] = {
    "jobs_enqueued": "jobs created by an enqueue or a fan-out",
    "enqueue_duplicates": "enqueues held off because their key already had a job or an intent",
    "enqueue_collapsed": "enqueues of a debounced or throttled task that joined its pending job",
    "claim_conflicts": "jobs completed as duplicates: their key was claimed by another job",
    "jobs_completed": "jobs whose handler committed",
    "jobs_retried": "failed attempts with another attempt to come",
    "jobs_dead": "jobs dead-lettered (attempts spent, a permanent error, or a lease rescued last)",
    "deliveries_stale": "broker deliveries of a relayed job that had moved on (cancelled, or "
    "past that attempt: a duplicate publish, a lost acknowledgement), acknowledged unrun",
    "leases_expired": "job leases that ran out and were rescued",
    "sends_sent": "messages the provider accepted (settled sent)",
    "sends_retried": "delivery attempts that failed and will be retried",
    "sends_throttled": "delivery attempts the provider throttled (429, SMTP 421): each pauses "
    "its whole channel",
    "sends_waited": "messages given back unsent, no attempt spent, to wait for the channel's "
    "rate limit, a pause, or a fresh lease",
    "sends_dead": "messages that became dead (refused for good, or rescued too often)",
    "sends_ambiguous": "messages held ambiguous for a person (an outcome no resend can settle)",
    "sends_resent": "messages resent after an unknown outcome (same key, or policy retry)",
    "sends_possible_duplicate": "resends that may have delivered a second copy",
    "sends_lease_expired": "dispatcher leases rescued after they ran out",
    "duplicates_reported": "sent messages a recipient reported receiving twice (audited)",
    "sends_settled_by_provider": "held messages settled sent because their provider reported "
    "taking them (audited as provider)",
    "provider_events": "verified provider delivery events recorded against a message of theirs "
    "(per channel and stage: reports:<channel>:<stage>)",
    "provider_events_duplicate": "provider delivery events received again (a provider's retry): "
    "changed nothing",
    "provider_events_unmatched": "verified provider delivery events about no message of this "
    "database (another system's on the account, or pruned): acknowledged, not acted on",
    "provider_events_unreadable": "signed provider requests that are not a delivery event (no "
    "type or data, not a JSON object): acknowledged, not acted on",
    "provider_events_unstorable": "signed provider delivery events holding text no store keeps "
    "(a NUL, a lone surrogate): acknowledged, not recorded",
    "api_auth_refused": "HTTP API requests refused for a missing, malformed, unknown, revoked or "
    "wrong key (401)",
    "api_auth_throttled": "HTTP API requests refused unread (429) because their address sent too "
    "many of those in a window (ApiSettings.auth_failures)",
    "pruned_jobs": "finished jobs deleted by retention, with their attempts",
    "pruned_intents": "intents deleted under their task's keep_intents",
    "payloads_dropped": "sent messages whose payload (recipients, bodies) retention dropped",
    "pruned_messages": "sent messages deleted by retention, with their delivery attempts",
    "pruned_delivery_attempts": "delivery attempts of sent messages deleted by retention",
    "pruned_provider_events": "provider delivery events deleted by retention (a message keeps "
    "its furthest stage)",
    "pruned_audit_entries": "audit entries deleted by retention",
    "pruned_schedule_runs": "finished schedule runs (period summaries) deleted by retention",
}


def complete(counts: Mapping[str, int]) -> dict[str, int]:
    """Every known counter, 0 where nothing was counted yet, then any others the store holds."""
    return {**{name: int(counts.get(name, 0)) for name in COUNTERS}, **counts}


def settled_as(state: str, outcome: str | None) -> str:
    """The counter a settled job adds to — as `job_finish` counts it in SQL (jobs.sql)."""
    if state == "done":
        return "claim_conflicts" if outcome == "duplicate" else "jobs_completed"
    return "jobs_retried" if state == "ready" else "jobs_dead"


def settlement_counts(settled: Iterable[tuple[str, str | None]]) -> dict[str, int]:
    """Counts of (state, outcome) settlements, for a transport with no job rows to settle."""
    counts: dict[str, int] = {}
    for state, outcome in settled:
        name = settled_as(state, outcome)
        counts[name] = counts.get(name, 0) + 1
    return counts
