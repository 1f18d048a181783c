"""Who may try a console password now: the login throttle.

What it stands against, and how:

- **Guessing one user's password from one address.** At most `per_address` failures per (name,
  address) within `window_s`; past that, that address is refused for that name — the right
  password included, from there only — until its oldest failure leaves the window.
- **Guessing from many addresses.** From the `name_free`-th failure for a name within the window
  (from any address), each attempt at that name waits the name's delay after its latest
  failure: `name_delay_s`, doubling with each further failure, at most `name_delay_max_s`.
  An address that has not failed for the name keeps the turn it was told (`Retry-After`): an
  attacker failing again meanwhile cannot push it back. So the user, from an address of their
  own, always gets in after at most the delay they were shown; an attacker's address cannot
  lock a name for everyone (issue 44's lockout as denial of service). The price: every fresh
  address is let through at its turn, so many addresses are slowed, not stopped
  (docs/security.md, "What is not defended").
- **Racing it.** Checking and counting are one step: `attempt` counts a failure before the
  password is verified (the slow part, in a thread) and `succeeded` takes it back, so a burst of
  concurrent guesses sees itself and at most `per_address` of it is verified.
- **Growing it.** It never holds a submitted name: the caller passes a bucket (a configured
  user's name, or `UNKNOWN` for every other name) and the address. An entry is made only by
  an attempt let through or by a reserved turn, never to read; entries not touched for longer
  than the window (plus the longest delay) are dropped as new ones come, and at `max_entries`
  the least recently touched goes first. IPv6 addresses count per /64, what one host is
  usually given.

Time is the injectable monotonic clock (`oncebox.kernel.clock.monotonic`), read under the lock.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from oncebox.kernel.clock import monotonic
from oncebox.kernel.errors import ConfigurationError

UNKNOWN = "\x00unknown"  # the bucket of every name no user has (a user's name is printable)

RefusedBy = Literal["address", "name"]


@dataclass(frozen=True)
class LoginLimits:
    """The login throttle's limits and the audit's budget (`ConsoleSettings.login`)."""

    per_address: int = 5  # failures per (name, address) within the window
    window_s: float = 15 * 60.0
    name_free: int = 5  # failures for a name (all addresses) within the window before it waits
    name_delay_s: float = 1.0  # the first wait; doubles with each further failure
    name_delay_max_s: float = 5 * 60.0
    max_entries: int = 10_000  # (name, address) pairs remembered
    audit_budget: int = 100  # refused logins audited one by one per window, in all

    def __post_init__(self) -> None:
        counts = (self.per_address, self.name_free, self.max_entries, self.audit_budget)
        spans = (self.window_s, self.name_delay_s, self.name_delay_max_s)
        if min(counts) < 1 or not all(math.isfinite(s) and s > 0 for s in spans):
            raise ConfigurationError(f"login limits must be positive: {self}")

    def name_delay(self, failures: int) -> float:
        """How long a name waits after its latest failure, with `failures` in the window."""
        if failures < self.name_free:
            return 0.0
        doublings = min(failures - self.name_free, 64)
        return min(self.name_delay_s * 2.0**doublings, self.name_delay_max_s)


@dataclass(frozen=True)
class Verdict:
    """What `attempt` decided. Let through (`allowed`), a failure is already counted at `at`;
    refused, the caller answers 429 with `Retry-After: wait_s`. `audited` is how many refusals
    of this (name, address) the caller's audit entry stands for: 0 while one entry already
    stands for this window's (see `console.refusals`)."""

    bucket: str
    address: str
    at: float
    allowed: bool
    retry_after: float = 0.0
    refused_by: RefusedBy | None = None
    audited: int = 0

    @property
    def wait_s(self) -> int:
        return max(1, math.ceil(self.retry_after)) if not self.allowed else 0


@dataclass
class _Pair:
    """One (name, address): its recent failures, a reserved turn, its refusals' audit."""

    failures: list[float]  # oldest first, at most per_address (a deque costs 600 bytes more)
    touched: float
    turn: float | None = None  # when an address that had not failed may try (told so)
    audited_at: float | None = None  # when one of its refusals was last audited
    unaudited: int = 0  # refusals since then, counted in the next entry


@dataclass
class _Name:
    failures: deque[float] = field(default_factory=lambda: deque(maxlen=_NAME_FAILURES_KEPT))
    touched: float = 0.0


_NAME_FAILURES_KEPT = 128  # past name_free + 64 the delay is at its maximum anyway


class LoginThrottle:
    """The console's login throttle (see the module's docstring). Thread-safe."""

    def __init__(
        self, limits: LoginLimits | None = None, *, clock: Callable[[], float] = monotonic
    ) -> None:
        self.limits = limits or LoginLimits()
        self._clock = clock
        self._pairs: OrderedDict[tuple[str, str], _Pair] = OrderedDict()  # least recent first
        self._names: OrderedDict[str, _Name] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """The entries held: (name, address) pairs and names."""
        with self._lock:
            return len(self._pairs) + len(self._names)

    def attempt(self, bucket: str, address: str) -> Verdict:
        """Whether `address` may try a password for `bucket` now; when it may, a failure is
        counted at once (`succeeded` takes it back)."""
        limits = self.limits
        now = self._clock()
        key = (bucket, address)
        with self._lock:
            self._forget_stale(now)
            pair = self._pairs.get(key)
            if pair is not None:
                del pair.failures[: _passed(pair.failures, now - limits.window_s)]
            if pair is not None and len(pair.failures) >= limits.per_address:
                wait = pair.failures[0] + limits.window_s - now
                return self._refused(key, pair, now, wait, "address")
            name = self._names.get(bucket)
            if name is not None:
                for _ in range(_passed(name.failures, now - limits.window_s)):
                    name.failures.popleft()
            delay = limits.name_delay(len(name.failures)) if name is not None else 0.0
            turn = name.failures[-1] + delay if name is not None and delay > 0 else now
            if now < turn:
                if pair is not None and pair.failures:  # it has failed: the name's delay
                    return self._refused(key, pair, now, turn - now, "name")
                pair = pair or self._new_pair(key, now)
                if pair.turn is None or now > pair.turn + limits.window_s:
                    pair.turn = turn  # its turn, kept whatever fails meanwhile
                if now < pair.turn:
                    return self._refused(key, pair, now, pair.turn - now, "name")
            pair = pair or self._new_pair(key, now)
            pair.turn = None
            pair.failures.append(now)
            pair.touched = now
            self._pairs.move_to_end(key)
            name = name or self._new_name(bucket, now)
            name.failures.append(now)
            name.touched = now
            self._names.move_to_end(bucket)
            return Verdict(bucket, address, now, allowed=True)

    def succeeded(self, verdict: Verdict) -> None:
        """The password `verdict` let through was right: its failure is taken back, and the
        address's earlier failures for the name are forgiven (they were the user's)."""
        with self._lock:
            pair = self._pairs.pop((verdict.bucket, verdict.address), None)
            name = self._names.get(verdict.bucket)
            if name is not None:
                for at in pair.failures if pair is not None else [verdict.at]:
                    if at in name.failures:
                        name.failures.remove(at)
                if not name.failures:
                    del self._names[verdict.bucket]

    def _refused(
        self, key: tuple[str, str], pair: _Pair, now: float, wait: float, by: RefusedBy
    ) -> Verdict:
        """A refusal, counted for the audit: the first of a window is audited (standing for
        those counted since the last entry), the others only counted."""
        if pair.audited_at is None or now - pair.audited_at >= self.limits.window_s:
            audited, pair.audited_at, pair.unaudited = pair.unaudited + 1, now, 0
        else:
            audited, pair.unaudited = 0, pair.unaudited + 1
        pair.touched = now
        self._pairs.move_to_end(key)
        return Verdict(*key, now, allowed=False, retry_after=wait, refused_by=by, audited=audited)

    def _new_pair(self, key: tuple[str, str], now: float) -> _Pair:
        while len(self._pairs) >= self.limits.max_entries:
            self._pairs.popitem(last=False)  # the least recently touched
        pair = _Pair([], now)
        self._pairs[key] = pair
        return pair

    def _new_name(self, bucket: str, now: float) -> _Name:
        while len(self._names) >= self.limits.max_entries:
            self._names.popitem(last=False)
        name = _Name(touched=now)
        self._names[bucket] = name
        return name

    def _forget_stale(self, now: float) -> None:
        """Drop the entries untouched for longer than anything in them can matter: the window
        plus the longest delay (a reserved turn lies at most that far ahead)."""
        stale = now - self.limits.window_s - self.limits.name_delay_max_s
        _drop_untouched(self._pairs, stale)
        _drop_untouched(self._names, stale)


class _Entry(Protocol):
    touched: float


K = TypeVar("K")
E = TypeVar("E", bound=_Entry)


def _drop_untouched(table: OrderedDict[K, E], stale: float) -> None:
    """Drop the entries touched before `stale`: they come first (least recently touched)."""
    while table and next(iter(table.values())).touched < stale:
        table.popitem(last=False)


def _passed(failures: list[float] | deque[float], since: float) -> int:
    """How many of `failures` (oldest first) are at or before `since`: out of the window."""
    count = 0
    for at in failures:
        if at > since:
            break
        count += 1
    return count
