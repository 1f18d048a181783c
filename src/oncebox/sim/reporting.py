"""A simulated provider that keeps no idempotency keys, answers lookups with lag, and reports
what became of every message it took — late, twice and out of order, as webhooks arrive.

Each message it takes is, by the run's choice, delivered (most) or failed (the provider had it
and could not send it). Its events follow, each due after a delay of its own (so a later stage
may come first, and an event may come after the resolver's grace): `email.sent`, sometimes
`email.delivery_delayed`, then `email.delivered` (now and then `email.bounced`) or
`email.failed`; now and then a kind oncebox does not track (`email.scheduled`). The reporter
actor (`sim/parts/reports.py`) posts them through the receiver's own path.

Its lookup (`status`) finds a message only `LAG` after it was taken — the search trails the
intake — and says so honestly after that: "sent" for any copy of the token it took, else
"not_found"; now and then "unknown" (the search itself failed). Every answer is kept (`lookups`):
the checker asks whether a resend had one that proved its hold never arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from oncebox.deliveries.events import KINDS, STAGES
from oncebox.providers import Outgoing, Receipt
from oncebox.providers.base import Capabilities, StatusAnswer
from oncebox.sim.providers import SimProvider

LAG = timedelta(seconds=20)  # how long the lookup takes to find a message it took
PAGES = 3  # the pages a search reads before it answers (a yield point each)
# How late an event comes after its message was taken, by choice: at once, soon, within the
# grace, past it.
DELAYS = (
    timedelta(0),
    timedelta(seconds=5),
    timedelta(seconds=30),
    timedelta(minutes=2),
    timedelta(minutes=15),
)


@dataclass
class Report:
    """One event the provider will post: the same `event_id` on every retry of it."""

    event_id: str
    kind: str
    token: str
    provider_id: str
    due: datetime

    @property
    def stage(self) -> str | None:
        return KINDS.get(self.kind)

    def payload(self) -> dict[str, Any]:
        """As Resend sends it (`deliveries/events.py` reads it)."""
        return {
            "type": self.kind,
            "created_at": self.due.isoformat(),
            "data": {"email_id": self.provider_id, "tags": {"oncebox": self.token}},
        }


def furthest(stages: list[str | None]) -> int:
    """The furthest of `stages` as its place in `STAGES` (-1: none)."""
    return max((STAGES.index(stage) for stage in stages if stage is not None), default=-1)


@dataclass(frozen=True)
class Lookup:
    """One answer of the provider's search: to which token, in which step, at what time."""

    token: str
    step: int
    at: datetime
    answer: StatusAnswer


@dataclass
class ReportingProvider(SimProvider):
    """See the module docstring. `waiting`: the events not yet acknowledged (and those the
    provider will send again); `failed`: the indexes in `deliveries` of the copies it could not
    send."""

    capabilities: ClassVar[Capabilities] = Capabilities(lookup=True, lookup_lag=LAG)
    waiting: list[Report] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)
    lookups: list[Lookup] = field(default_factory=list)

    def _take(self, outgoing: Outgoing, key: str) -> Receipt:
        receipt = super()._take(outgoing, key)
        index = len(self.deliveries) - 1
        failed = self.choices.below(3) == 0
        if failed:
            self.failed.add(index)
        kinds = ["email.sent"]
        if self.choices.below(3) == 0:
            kinds.insert(0, "email.scheduled")
        if failed:
            kinds.append("email.failed")
        else:
            if self.choices.below(4) == 0:
                kinds.append("email.delivery_delayed")
            kinds.append("email.delivered")
            if self.choices.below(8) == 0:
                kinds.append("email.bounced")
        now = self.now()
        for n, kind in enumerate(kinds):
            due = now + DELAYS[self.choices.below(len(DELAYS))]
            self.waiting.append(
                Report(
                    f"{self.name}-evt-{index + 1}-{n}",
                    kind,
                    outgoing.token,
                    str(receipt.provider_id),
                    due,
                )
            )
        return receipt

    def status(
        self, outgoing: Outgoing, idempotency_key: str
    ) -> tuple[StatusAnswer, Receipt | None]:
        """What the provider's search says of the token: the request leaves when the caller
        gets its turn (its answer is the provider's state then), the search pages through the
        provider's log, and the answer travels back — a yield point each: a search is slow
        beside a send, and other workers move meanwhile."""
        self.scheduler.point(f"lookup.{self.name}")
        now = self.now()
        found = [
            n
            for n, copy in enumerate(self.deliveries)
            if copy.token == outgoing.token and copy.at + LAG <= now
        ]
        unknown = self.choices.below(8) == 0
        answer: StatusAnswer = "unknown" if unknown else "sent" if found else "not_found"
        self.lookups.append(Lookup(outgoing.token, len(self.scheduler.steps), now, answer))
        for _page in range(PAGES):
            self.scheduler.point(f"lookup.{self.name}.page")
        self.scheduler.point(f"lookup.{self.name}.answer")
        if answer == "sent":
            return answer, Receipt(f"{self.name}-{found[0] + 1}")
        return answer, None

    def due(self) -> list[Report]:
        """The events whose time has come, in the order they were made."""
        now = self.now()
        return [report for report in self.waiting if report.due <= now]
