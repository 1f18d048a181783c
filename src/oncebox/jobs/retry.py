"""Retry policy: how many attempts, how long between them, and which failures are final.

Backoff is exponential with *full jitter* (a uniformly random delay between zero and the capped
exponential), so a burst of failures does not come back as a synchronised burst of retries. The
delay is persisted as the job's `run_at`; no process sleeps on a retry.

Classification, first match wins:
1. `oncebox.Permanent` raised by the handler, or a configuration or argument error
   (`ConfigurationError`, `InvalidArguments`: retrying cannot fix them) → dead now;
2. `oncebox.RetryLater(delay=…)` → retry after that delay (or the backoff);
3. an instance of `permanent_on` → dead now;
4. `retry_on` given and the exception is not an instance of it → dead now;
5. anything else → retry, after `delay_for[type]` when the exception's type is listed there,
   else after the backoff.
A retryable failure on the last allowed attempt, or after `max_age`, is dead too.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from oncebox.kernel.errors import ConfigurationError, EnqueueError, Permanent, RetryLater


@dataclass(frozen=True)
class Decision:
    """What happens after a failed attempt: retry after `delay`, or not (dead)."""

    retry: bool
    delay: timedelta = timedelta(0)
    reason: str = ""


@dataclass(frozen=True)
class Retry:
    """A task's retry policy; see the module docstring. Defaults: 5 attempts, 1 s → 1 h."""

    max_attempts: int = 5
    base_delay: timedelta = timedelta(seconds=1)
    max_delay: timedelta = timedelta(hours=1)
    max_age: timedelta | None = None
    permanent_on: tuple[type[BaseException], ...] = ()
    retry_on: tuple[type[BaseException], ...] | None = None
    delay_for: Mapping[type[BaseException], timedelta] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be an int ≥ 1, not {self.max_attempts!r}")
        if self.base_delay < timedelta(0) or self.max_delay < self.base_delay:
            raise ConfigurationError("retry delays must satisfy 0 ≤ base_delay ≤ max_delay")
        if self.max_age is not None and self.max_age <= timedelta(0):
            raise ConfigurationError("max_age must be positive")
        if any(delay < timedelta(0) for delay in self.delay_for.values()):
            raise ConfigurationError("delay_for delays must not be negative")

    def backoff_cap(self, attempt: int) -> timedelta:
        """The upper bound of the jittered delay after failed attempt number `attempt` (1-based)."""
        exponent = min(max(attempt - 1, 0), 62)
        cap = self.base_delay * (2**exponent) if self.base_delay else timedelta(0)
        return min(cap, self.max_delay)

    def backoff(self, attempt: int, rng: random.Random) -> timedelta:
        cap = self.backoff_cap(attempt)
        return timedelta(microseconds=rng.randint(0, cap // timedelta(microseconds=1)))

    def decide(
        self, error: BaseException, attempt: int, attempts_left: int, rng: random.Random
    ) -> Decision:
        """Classify a failure of attempt `attempt`, with `attempts_left` allowed after it."""
        if isinstance(error, Permanent):
            return Decision(False, reason="the handler raised Permanent")
        if isinstance(error, (ConfigurationError, EnqueueError)):
            return Decision(False, reason=f"{type(error).__name__} will not go away by retrying")
        if isinstance(error, self.permanent_on):
            return Decision(False, reason=f"{type(error).__name__} is declared permanent")
        if (
            self.retry_on is not None
            and not isinstance(error, RetryLater)
            and not isinstance(error, self.retry_on)
        ):
            return Decision(False, reason=f"{type(error).__name__} is not declared retryable")
        if attempts_left <= 0:
            return Decision(False, reason=f"attempt {attempt} was the last allowed")
        if isinstance(error, RetryLater) and error.delay is not None:
            return Decision(True, error.delay)
        for kind, delay in self.delay_for.items():
            if isinstance(error, kind):
                return Decision(True, delay)
        return Decision(True, self.backoff(attempt, rng))
