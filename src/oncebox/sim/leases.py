"""Who may end a lease: its holder while it lasts, anyone once it has run out.

A lease is the fence every settlement and give-back is checked against: the lease token and the
attempt it was taken at. A writer that ends a lease it does not hold — a give-back by a consumer
back from an outage, of jobs that were rescued and leased by another meanwhile — takes work from
a worker still at it: that worker's settlement is then fenced out and rolled back, the job runs
again, and its attempt is counted by someone who never ran it. Nothing commits twice, so no
other invariant sees it; this one does, after every step:

    F3  a lease that has not run out (its deadline still ahead of the store's clock) ends only in
        a step its holder moved in: its settlement, its give-back, its own refusal. The rescuer
        takes only leases that ran out; an operator's actions wait for a job's lease to end.

The holder is named by the row (`leased_by`: host, process and the lane's name), and the world
knows which actor runs under which name (`World.holders`). A lease of a name the world does not
know (a lane built elsewhere) is not judged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Part, Rows

# The store's time runs a little ahead of the world's between the clock's moves (each step
# counts a millisecond): a lease this close to its end may be rescued already.
MARGIN = timedelta(seconds=1)
LEASED = {
    "job": "SELECT id, lease_token, leased_by, lease_expires_at FROM oncebox_all_jobs "
    "WHERE lease_token IS NOT NULL",
    "message": "SELECT id, lease_token, leased_by, lease_expires_at FROM oncebox_outbox "
    "WHERE lease_token IS NOT NULL",
}


def _instant(stored: Any) -> datetime:
    """A deadline as either store returns it: PostgreSQL's timestamp, SQLite's microseconds."""
    if isinstance(stored, datetime):
        return stored
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(stored))


class LeaseEnds(Part):
    """See the module docstring. Every world's, whatever parts its seed chose."""

    name = "leases"

    def __init__(
        self,
        moved: Callable[[], set[str]],
        holders: Mapping[str, str],
        now: Callable[[], datetime],
    ) -> None:
        self.moved = moved
        self.holders = holders
        self.now = now
        self._live: dict[tuple[str, int], tuple[Any, str, datetime]] = {}

    def after_step(self, rows: Rows) -> list[Violation]:
        leases = {
            (kind, int(row_id)): (token, str(holder), _instant(deadline))
            for kind, sql in LEASED.items()
            for row_id, token, holder, deadline in rows(sql)
        }
        found: list[Violation] = []
        moved, now = self.moved(), self.now()
        for (kind, row_id), (token, holder, deadline) in sorted(self._live.items()):
            if leases.get((kind, row_id), (None,))[0] == token or deadline <= now + MARGIN:
                continue
            actor = self.holders.get(holder.split(":", 2)[-1])  # host:pid:name
            if actor is not None and actor not in moved:
                found.append(
                    Violation(
                        "F3",
                        f"{kind} {row_id}: {holder}'s lease, live until {deadline:%H:%M:%S}, "
                        f"ended in a step of {', '.join(sorted(moved))}",
                    )
                )
        self._live = leases
        return found
