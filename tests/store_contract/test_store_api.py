"""The HTTP API's records, on every store: keys (a name once, revoked for good, the digest only)
and Idempotency-Key records (held by one request at a time while it renews its hold, the first
answer kept until it expires, an abandoned hold taken over by a retry of the same body only)."""

from __future__ import annotations

from datetime import timedelta

from oncebox.store import open_store
from oncebox.store.protocol import Store
from oncebox.store.records import ApiRequestClaim
from support.contract import T0, advance

RETAIN = timedelta(hours=24)
HOLD = timedelta(seconds=30)


def _claim(key_id: int, idem: str, fingerprint: str, claim: str) -> ApiRequestClaim:
    return ApiRequestClaim(key_id, idem, fingerprint, claim, RETAIN, HOLD)


def test_a_key_name_is_taken_once_and_a_revoke_keeps_its_first_instant(store: Store):
    made = store.api_key_insert("billing", "enqueue read", "a" * 64, "20/s", "ops")
    assert made is not None and made.created_at == T0 and made.revoked_at is None
    assert store.api_key_insert("billing", "operate", "b" * 64, "1/s", "ops") is None
    assert store.api_key_get(made.id) == made
    other = store.api_key_insert("cron", "operate", "c" * 64, "1/s", "ops")
    assert other is not None and other.id != made.id
    assert [k.name for k in store.api_key_list()] == ["billing", "cron"]
    revoked = store.api_key_revoke("billing")
    assert revoked is not None and revoked.revoked_at == T0
    advance(store, timedelta(minutes=5))
    again = store.api_key_revoke("billing")
    assert again is not None and again.revoked_at == T0
    assert store.api_key_revoke("nobody") is None
    assert store.api_key_get(10_000) is None
    # a revoked name stays taken: what the key did stays readable under it
    assert store.api_key_insert("billing", "read", "d" * 64, "1/s", "ops") is None


def test_an_idempotency_key_is_held_by_one_request_and_keeps_its_first_answer(store: Store):
    key = store.api_key_insert("billing", "enqueue", "a" * 64, "20/s", "ops")
    assert key is not None
    held = store.api_request_claim(_claim(key.id, "order-7", "fp-a", "first"))
    assert held is not None and held.status is None and held.expires_at == T0 + RETAIN
    # a second request with the key, same body or not, holds nothing while the first runs
    assert store.api_request_claim(_claim(key.id, "order-7", "fp-a", "second")) is None
    assert store.api_request_claim(_claim(key.id, "order-7", "fp-b", "third")) is None
    # only the holder records the answer, once
    assert not store.api_request_finish(key.id, "order-7", "second", 201, '{"x": 2}')
    assert store.api_request_finish(key.id, "order-7", "first", 201, '{"x": 1}')
    assert not store.api_request_finish(key.id, "order-7", "first", 500, "{}")
    found = store.api_request_get(key.id, "order-7")
    assert found is not None and (found.status, found.response, found.claim) == (
        201,
        '{"x": 1}',
        "first",
    )
    # answered: not taken over, however stale, until it expires
    advance(store, HOLD * 10)
    assert store.api_request_claim(_claim(key.id, "order-7", "fp-a", "late")) is None
    # another API key's records never meet this one's
    other = store.api_key_insert("cron", "enqueue", "b" * 64, "20/s", "ops")
    assert other is not None
    assert store.api_request_get(other.id, "order-7") is None
    assert store.api_request_claim(_claim(other.id, "order-7", "fp-a", "theirs")) is not None


def test_an_abandoned_hold_is_taken_over_by_the_same_body_once_it_runs_out(store: Store):
    key = store.api_key_insert("billing", "enqueue", "a" * 64, "20/s", "ops")
    assert key is not None
    assert store.api_request_claim(_claim(key.id, "k", "fp-a", "dead")) is not None
    advance(store, HOLD - timedelta(seconds=1))
    assert store.api_request_claim(_claim(key.id, "k", "fp-a", "early")) is None
    advance(store, timedelta(seconds=1))
    assert store.api_request_claim(_claim(key.id, "k", "fp-b", "other-body")) is None
    taken = store.api_request_claim(_claim(key.id, "k", "fp-a", "retry"))
    assert taken is not None and taken.claim == "retry" and taken.started_at == T0 + HOLD
    # the dead holder, back, can neither answer nor release it
    assert not store.api_request_finish(key.id, "k", "dead", 201, "{}")
    assert not store.api_request_release(key.id, "k", "dead")
    assert store.api_request_release(key.id, "k", "retry")
    assert store.api_request_get(key.id, "k") is None
    assert store.api_request_claim(_claim(key.id, "k", "fp-b", "fresh")) is not None


def test_a_renewed_hold_outlasts_its_first_and_a_holder_taken_over_cannot_renew(store: Store):
    key = store.api_key_insert("billing", "enqueue", "a" * 64, "20/s", "ops")
    assert key is not None
    held = store.api_request_claim(_claim(key.id, "k", "fp-a", "working"))
    assert held is not None and held.held_until == T0 + HOLD
    for _ in range(4):  # at work for two minutes, renewing as it goes
        advance(store, HOLD - timedelta(seconds=1))
        assert store.api_request_renew(key.id, "k", "working", HOLD)
        assert store.api_request_claim(_claim(key.id, "k", "fp-a", "retry")) is None
    found = store.api_request_get(key.id, "k")
    assert found is not None and found.held_until == T0 + 4 * (HOLD - timedelta(seconds=1)) + HOLD
    advance(store, HOLD)  # it stopped renewing: gone
    assert store.api_request_claim(_claim(key.id, "k", "fp-a", "retry")) is not None
    assert not store.api_request_renew(key.id, "k", "working", HOLD)
    assert store.api_request_finish(key.id, "k", "retry", 201, "{}")
    assert not store.api_request_renew(key.id, "k", "retry", HOLD)  # answered: nothing to hold


def test_records_expire_for_reads_claims_and_the_prune(store: Store):
    key = store.api_key_insert("billing", "enqueue", "a" * 64, "20/s", "ops")
    assert key is not None
    for n in range(3):
        assert store.api_request_claim(_claim(key.id, f"k{n}", "fp", "c")) is not None
        assert store.api_request_finish(key.id, f"k{n}", "c", 201, "{}")
        advance(store, timedelta(hours=1))
    assert store.api_request_prune(10) == 0
    advance(store, RETAIN - timedelta(hours=2, minutes=30))  # k0 is 24.5 h old, k1 23.5 h
    assert store.api_request_get(key.id, "k0") is None
    assert store.api_request_get(key.id, "k1") is not None
    assert store.api_request_prune(10) == 1
    advance(store, timedelta(hours=5))
    again = store.api_request_claim(_claim(key.id, "k1", "another-body", "new"))
    assert again is not None and again.status is None  # expired: the key is free again
    assert store.api_request_prune(1) == 1  # k2, oldest first; k1 is fresh again
    other = open_store(store.url)
    try:
        assert other.api_request_prune(10) == 0
        assert other.api_request_get(key.id, "k1") is not None
    finally:
        other.close()
