"""Providers whose every answer is a choice of the run.

A send is a yield point, then one of: accepted; refused for now (retryable); throttled with a
`Retry-After`; refused for good; timed out before the provider took it; or taken, with the answer
lost (the caller cannot tell those two apart: both are `SendAmbiguous`). An idempotent provider
remembers each key for its window, on the store's clock, and answers a repeat within it with the
first reply, delivering nothing; past the window it has forgotten, and delivers again — as the
services it stands for do. Every delivery is recorded: the checker counts copies from here, the
outside world's side, never from oncebox's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from oncebox.providers import (
    Outgoing,
    Receipt,
    SendAmbiguous,
    SendPermanent,
    SendRetryable,
    SendThrottled,
)
from oncebox.sim.choices import Choices
from oncebox.sim.scheduler import Scheduler

# Out of 100: how a send ends. Accepted most often; every other outcome often enough to meet.
ACCEPT, RETRYABLE, THROTTLED, PERMANENT, LOST_BEFORE = 70, 78, 83, 85, 92  # the rest: lost after
ODDS = (ACCEPT, RETRYABLE, THROTTLED, PERMANENT, LOST_BEFORE)


@dataclass(frozen=True)
class Delivered:
    token: str
    key: str
    at: datetime


@dataclass
class SimProvider:
    """See the module docstring. `window` None: the provider keeps no idempotency keys."""

    name: str
    scheduler: Scheduler
    choices: Choices
    now: Callable[[], datetime]
    window: timedelta | None = None
    odds: tuple[int, int, int, int, int] = ODDS  # a provider's own: `ACCEPT, …, LOST_BEFORE`
    deliveries: list[Delivered] = field(default_factory=list)
    _first: dict[str, tuple[datetime, Receipt]] = field(default_factory=dict)
    idempotent: bool = field(init=False)
    idempotency_window: timedelta | None = field(init=False)

    def __post_init__(self) -> None:
        self.idempotent = self.window is not None
        self.idempotency_window = self.window

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        """The request reaches the provider when the sender calls: its fate is settled then, and
        the sender parks while the answer travels back (a stall there is a late answer). A
        sender frozen between its last check and its request's first byte is outside the model
        (docs/simulation.md)."""
        accept, retryable, throttled, permanent, lost_before = self.odds
        roll = self.choices.below(100)
        taken = roll < accept or roll >= lost_before
        receipt = self._take(outgoing, idempotency_key) if taken else None
        self.scheduler.point(f"send.{self.name}")
        if receipt is not None and roll < accept:
            return receipt
        if receipt is not None:
            raise SendAmbiguous(f"{self.name}: taken, and the answer lost")
        if roll < retryable:
            raise SendRetryable(f"{self.name}: 503")
        if roll < throttled:
            raise SendThrottled(f"{self.name}: 429", timedelta(seconds=1 + roll - retryable))
        if roll < permanent:
            raise SendPermanent(f"{self.name}: 422")
        raise SendAmbiguous(f"{self.name}: timed out before the provider took it")

    def _take(self, outgoing: Outgoing, key: str) -> Receipt:
        now = self.now()
        if self.window is not None:
            first = self._first.get(key)
            if first is not None and now - first[0] < self.window:
                return first[1]
        self.deliveries.append(Delivered(outgoing.token, key, now))
        receipt = Receipt(f"{self.name}-{len(self.deliveries)}")
        if self.window is not None:
            self._first[key] = (now, receipt)
        return receipt

    def copies(self) -> dict[str, int]:
        """How many times the outside world received each token."""
        counted: dict[str, int] = {}
        for delivered in self.deliveries:
            counted[delivered.token] = counted.get(delivered.token, 0) + 1
        return counted
