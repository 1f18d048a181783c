"""Rate limits shared by every dispatcher on every host: token buckets kept in the store.

A channel's limits (`"14/s"`, `"50000/day"`: `limits/rates.py`) are one bucket each, holding
at most `count` tokens and refilling at `count / period`. Taking tokens happens under the
store's lock on the channel's buckets, with the database's clock, so three dispatchers sharing
`10/s` together never send more than the bucket allows — however their hosts' clocks drift. A
channel paused by its provider (HTTP 429 `Retry-After`, SMTP 421) grants nothing until the pause
ends.

Waiting is not sleeping: a dispatcher that gets fewer tokens than it leased rows gives the rest
back (due again when the bucket will have refilled), so a wait never spends an attempt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from oncebox.store.records import BucketState


@dataclass(frozen=True)
class Grant:
    """How many sends may start now; when to look again for the rest."""

    granted: int
    retry_in: timedelta
    paused_until: datetime | None = None


def take(
    buckets: list[BucketState], want: int, now: datetime, paused_until: datetime | None
) -> tuple[list[BucketState], Grant]:
    """Take up to `want` tokens from every bucket at once (the same number from each)."""
    if paused_until is not None and paused_until > now:
        return buckets, Grant(0, paused_until - now, paused_until)
    levels = [bucket.level(now) for bucket in buckets]
    granted = min([want, *(math.floor(level) for level in levels)])
    granted = max(granted, 0)
    # A taker that read `now` before another took the lock sees a bucket updated after its
    # `now`: it refills nothing (`level`), and the bucket's time never moves back — else the next
    # take would refill that interval a second time.
    after = [
        replace(bucket, tokens=level - granted, updated_at=max(now, bucket.updated_at))
        for bucket, level in zip(buckets, levels, strict=True)
    ]
    waits = [(1.0 - bucket.tokens) / bucket.refill_per_s for bucket in after if bucket.tokens < 1.0]
    return after, Grant(granted, timedelta(seconds=max(waits, default=0.0)))
