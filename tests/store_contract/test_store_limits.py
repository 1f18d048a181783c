"""Rate limits and channel pauses, operation by operation, on every store: buckets configured
per channel, read and written back under their lock by one decision, and pauses that every
dispatcher sees and that never get shorter."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from oncebox.store.params import BucketSpec
from oncebox.store.protocol import Store
from oncebox.store.records import BucketState
from support.contract import T0, advance

Seen = tuple[list[BucketState], datetime, datetime | None]


def look(store: Store, channel: str, names: list[str]) -> Seen:
    """What a decision is shown, leaving the buckets as they are."""
    return store.rate_bucket_apply(channel, names, lambda b, now, paused: ([], (b, now, paused)))


def test_rate_bucket_configure_creates_full_buckets_per_channel(store: Store):
    store.rate_bucket_configure(
        "email", [BucketSpec("10/s", 10.0, 10.0), BucketSpec("1000/day", 1000.0, 1000 / 86400)]
    )
    store.rate_bucket_configure("sms", [BucketSpec("10/s", 2.0, 1.0)])
    buckets, now, paused = look(store, "email", ["10/s", "1000/day", "unknown"])
    assert (now, paused) == (T0, None)
    assert sorted(buckets, key=lambda b: b.name) == [
        BucketState("10/s", 10.0, 10.0, 10.0, T0),
        BucketState("1000/day", 1000.0, 1000 / 86400, 1000.0, T0),
    ]
    assert look(store, "sms", ["10/s"])[0] == [BucketState("10/s", 2.0, 1.0, 2.0, T0)]
    assert look(store, "ops", ["10/s"])[0] == []


def test_rate_bucket_apply_writes_back_what_the_decision_returns(store: Store):
    store.rate_bucket_configure("email", [BucketSpec("5/min", 5.0, 5 / 60)])
    advance(store, timedelta(seconds=12))

    def take_two(buckets: list[BucketState], now: datetime, paused: datetime | None):
        [bucket] = buckets
        after = dataclasses.replace(bucket, tokens=bucket.tokens - 2, updated_at=now)
        return [after], ("granted", 2, now)

    assert store.rate_bucket_apply("email", ["5/min"], take_two) == (
        "granted",
        2,
        T0 + timedelta(seconds=12),
    )
    [bucket], _now, _paused = look(store, "email", ["5/min"])
    assert (bucket.tokens, bucket.updated_at) == (3.0, T0 + timedelta(seconds=12))


def test_reconfiguring_a_bucket_keeps_its_tokens_within_the_new_capacity(store: Store):
    store.rate_bucket_configure("email", [BucketSpec("burst", 10.0, 1.0)])
    store.rate_bucket_apply(
        "email",
        ["burst"],
        lambda b, now, paused: ([dataclasses.replace(b[0], tokens=7.0)], None),
    )
    store.rate_bucket_configure("email", [BucketSpec("burst", 4.0, 0.5)])
    [smaller], _now, _paused = look(store, "email", ["burst"])
    assert (smaller.capacity, smaller.refill_per_s, smaller.tokens) == (4.0, 0.5, 4.0)
    store.rate_bucket_configure("email", [BucketSpec("burst", 20.0, 2.0)])
    [larger], _now, _paused = look(store, "email", ["burst"])
    assert (larger.capacity, larger.tokens) == (20.0, 4.0)  # a bigger bucket is not refilled


def test_channel_pause_pauses_a_channel_for_every_dispatcher_and_never_shortens(store: Store):
    until = store.channel_pause("email", timedelta(minutes=5), "HTTP 429")
    assert until == T0 + timedelta(minutes=5)
    assert look(store, "email", [])[2] == until
    assert look(store, "sms", [])[2] is None
    assert store.channel_pause("email", timedelta(minutes=1), "a shorter 429") == until
    advance(store, timedelta(minutes=2))
    longer = store.channel_pause("email", timedelta(minutes=10), "SMTP 421")
    assert longer == T0 + timedelta(minutes=12)
    store.rate_bucket_configure("email", [BucketSpec("10/s", 10.0, 10.0)])
    buckets, now, paused = look(store, "email", ["10/s"])
    assert ([b.name for b in buckets], now, paused) == (["10/s"], T0 + timedelta(minutes=2), longer)
