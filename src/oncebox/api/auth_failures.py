"""Failed API authentications, per client address: an address whose requests came with a
missing, malformed, unknown, revoked or wrong key `limit.count` times within `limit.period` is
answered 429 (`auth-throttled`, with `Retry-After`) until that window ends — before its key is
looked up, so a flood of bad keys costs the database nothing. A key guessed at 256 bits is not
the threat; the load and the noise are.

- Check and count are one step: each request from an address takes a provisional failure as it
  is admitted, and a request whose key authenticates gives it back. A burst of N requests at
  once therefore has at most `limit.count` of them verified, not N (the race the console's
  login throttle had).
- Never a lock of valid keys: the count is per address, so another address's failures never
  refuse a key; and a key that authenticated from this process before passes even a throttled
  address (callers behind one proxy or NAT share an address, and one of them sending bad keys
  must not lock out the others). Such keys are kept as their secret's SHA-256, the digest the
  store holds too, in a bounded table. A key never seen here, from a throttled address, waits
  out the window.
- Bounded memory: at most `capacity` addresses (the least recently seen forgotten first) and
  `trusted` keys, whatever is sent. Each server process keeps its own tables: N servers behind
  a load balancer allow an address N times the limit.
- Counted: `api_auth_refused` (every 401) and `api_auth_throttled` (every such 429) are durable
  counters, added in batches (`flush`, every few seconds and at shutdown), so a flood of bad
  keys is not also a flood of writes.
"""

from __future__ import annotations

import hmac
import logging
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from oncebox.api.keys import ApiKey, digest, parse_token
from oncebox.kernel.clock import monotonic
from oncebox.kernel.inert import printable
from oncebox.limits.rates import Limit
from oncebox.store.protocol import Store

log = logging.getLogger("oncebox.api")
DEFAULT_LIMIT = "20/min"
CAPACITY = 10_000  # addresses
TRUSTED = 1_000  # keys


@dataclass(frozen=True)
class Attempt:
    """One request's way through: `wait` seconds to answer 429 with (None: admitted, to be
    ended with `AuthFailures.end`)."""

    address: str
    authorization: str | None
    wait: int | None
    window: float | None = None  # the window its provisional failure was counted in
    vouched: bool = False


@dataclass
class _Window:
    start: float
    failures: int


class AuthFailures:
    def __init__(
        self,
        limit: Limit,
        *,
        capacity: int = CAPACITY,
        trusted: int = TRUSTED,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.limit = limit
        self._window_s = limit.period.total_seconds()
        self._capacity, self._trusted_capacity, self._clock = capacity, trusted, clock
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._trusted: OrderedDict[int, str] = OrderedDict()  # key id -> its secret's digest
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def begin(self, address: str, authorization: str | None) -> Attempt:
        """Admit a request (counting a provisional failure), or say how long it must wait."""
        vouched = self._vouched(authorization)
        now = self._clock()
        with self._lock:
            window = self._windows.get(address)
            if window is not None and now - window.start >= self._window_s:
                window = None
            if vouched:
                return Attempt(address, authorization, None, vouched=True)
            if window is not None and window.failures >= self.limit.count:
                self._counts["api_auth_throttled"] += 1
                self._windows.move_to_end(address)
                wait = max(1, math.ceil(window.start + self._window_s - now))
                return Attempt(address, authorization, wait)
            if window is None:
                window = _Window(now, 0)
                self._windows[address] = window
                while len(self._windows) > self._capacity:
                    self._windows.popitem(last=False)
            self._windows.move_to_end(address)
            window.failures += 1
            return Attempt(address, authorization, None, window.start)

    def give_back(self, attempt: Attempt) -> None:
        """The admitted request's key could not be checked (the store failed): its provisional
        failure is taken back, and nothing is learned of the key."""
        with self._lock:
            self._take_back(attempt)

    def _take_back(self, attempt: Attempt) -> None:
        window = self._windows.get(attempt.address)
        if window is not None and window.start == attempt.window:
            window.failures -= 1
            if window.failures <= 0:
                del self._windows[attempt.address]

    def end(self, attempt: Attempt, key: ApiKey | None) -> None:
        """The admitted request's key authenticated (`key`), or not (None)."""
        with self._lock:
            if key is not None:
                self._trust(key, attempt.authorization)
                self._take_back(attempt)  # the provisional failure given back
                return
            window = self._windows.get(attempt.address)
            self._counts["api_auth_refused"] += 1
            if attempt.vouched:  # a key seen before, refused now (revoked): no longer vouched
                parsed = parse_token(attempt.authorization)
                if parsed is not None:
                    self._trusted.pop(parsed[0], None)
            ours = window if window is not None and window.start == attempt.window else None
            if ours is not None and ours.failures == self.limit.count:  # said once a window
                log.warning(
                    "API: %d requests from %s with a missing or wrong API key within %.0f "
                    "s; its requests are refused (429) for the rest of that window, but "
                    "for keys that authenticated here before",
                    self.limit.count,
                    printable(attempt.address[:64]),
                    self._window_s,
                )

    def _vouched(self, authorization: str | None) -> bool:
        parsed = parse_token(authorization)
        if parsed is None:
            return False
        key_id, secret = parsed
        with self._lock:
            kept = self._trusted.get(key_id)
        return kept is not None and hmac.compare_digest(digest(secret).encode(), kept.encode())

    def _trust(self, key: ApiKey, authorization: str | None) -> None:
        parsed = parse_token(authorization)
        if parsed is None or parsed[0] != key.id:
            return
        self._trusted[key.id] = digest(parsed[1])
        self._trusted.move_to_end(key.id)
        while len(self._trusted) > self._trusted_capacity:
            self._trusted.popitem(last=False)

    def addresses(self) -> int:
        with self._lock:
            return len(self._windows)

    def pending(self) -> dict[str, int]:
        """The counts not written yet."""
        with self._lock:
            return dict(self._counts)

    def flush(self, store: Store) -> None:
        """Add the counts so far to the store's counters (kept for the next flush if it fails)."""
        with self._lock:
            counts, self._counts = dict(self._counts), Counter()
        if not counts:
            return
        try:
            store.counter_add(counts)
        except Exception:
            with self._lock:
                self._counts.update(counts)
            raise
