"""Each API key's request budget: a token bucket of the store's (`oncebox_rate_buckets`, channel
`~api/<key id>`), so every server shares it and the database's clock refills it — three servers
behind a load balancer grant a key its rate once, not three times. A request over the budget is
answered 429 with `Retry-After`, before its body is read or anything is written."""

from __future__ import annotations

import math
import threading
from datetime import datetime, timedelta

from oncebox.api.keys import ApiKey
from oncebox.outbox.ratelimit import Grant, take
from oncebox.store.params import BucketSpec
from oncebox.store.protocol import Store
from oncebox.store.records import BucketState

BUCKET = "requests"


def channel_of(key: ApiKey) -> str:
    return f"~api/{key.id}"


class Budgets:
    """Takes one request from a key's bucket; configures the bucket once per rate seen."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._configured: dict[int, str] = {}
        self._lock = threading.Lock()

    def spend(self, key: ApiKey) -> int | None:
        """None: the request may run; else the seconds to wait (at least 1)."""
        channel = channel_of(key)
        with self._lock:
            fresh = self._configured.get(key.id) != key.rate.name
        if fresh:
            spec = BucketSpec(BUCKET, float(key.rate.count), key.rate.refill_per_s)
            self.store.rate_bucket_configure(channel, [spec])
            with self._lock:
                self._configured[key.id] = key.rate.name

        def decide(
            buckets: list[BucketState], now: datetime, _paused: datetime | None
        ) -> tuple[list[BucketState], Grant]:
            return take(buckets, 1, now, None)

        grant = self.store.rate_bucket_apply(channel, [BUCKET], decide)
        if grant.granted:
            return None
        return max(1, math.ceil(grant.retry_in / timedelta(seconds=1)))
