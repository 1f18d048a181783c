"""The HTTP API's `Idempotency-Key` records at work: two clients retrying the same requests, the
holder of a key renewing its hold while it answers, and the API's pruner of expired records —
through `api/idempotency.py`'s `begin` and `finish`, the functions every POST with the header
goes through, over the world's store.

- `booking(n)`, keyed `booking/{n}`: what a request does (an enqueue, keyed, so a request run twice
  writes one job; the Idempotency-Key saves the second answer, not a second job);
- actors `api-client-1`, `api-client-2`: a request `POST /v1/tasks/booking/jobs` with one of three
  Idempotency-Keys (now and then with another body: a 422; told 409, in flight, it tries the
  same request again, up to four times), which, once it holds the key, works
  a while, enqueues and records its answer — or, by choice, fails (a 5xx lets the key go) or
  answers "not yet" (a 409, not kept). (Four clients: enough requests at once that a retry of
  one key meets its holder at work.);
- the holders' renewal threads (`idempotency.kept`, a beat every 10 s) beat through each move of
  the clock, within its step (`time_passed`): every request at work renews its hold, unless its
  process was stalled through the move; a holder's renewals end with its request or its
  process;
- actor `api-pruner`: `api_request_prune`, as the API's own loop calls it.

Records are kept 5 minutes here, not the API's 24 hours, so that a world's clock takes them past
their expiry, to be pruned or claimed afresh.

What must hold, after every step (docs/guarantees.md, the HTTP API):

    H1  a key held by a request still at work passes to another request (or is deleted) only
        once its hold has run out or the record expired: never from a holder that renewed in
        time — only the holder itself lets it go sooner (a 5xx, a 409)
    H2  a kept answer stays — same request, same status — until its record expires: neither
        taken over nor pruned before
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timedelta

from oncebox.api import idempotency
from oncebox.api.problems import Problem
from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Part, Rows, Stage, Starter
from oncebox.sim.parts.retained import instant

TASK = "booking"
KEY = "booking/{n}"
ORDERS = 1  # one key: every request meets the others
RETAIN = timedelta(minutes=5)
PATH = "/v1/tasks/booking/jobs"
PRUNE_BATCH = 2
RETRIES = 4  # a client's tries of one request while another holds its key
CLIENTS = 4  # enough requests at once that retries of one key meet a holder at work

Seen = tuple[str, int | None, datetime | None, datetime | None]  # claim, status, held, expires


class Requests(Part):
    """See the module docstring."""

    name = "requests"

    def __init__(self, world: Stage) -> None:
        self.world = world
        digest = hashlib.sha256(b"sim-api-key").hexdigest()
        key = world.real.api_key_insert("sim", "jobs:write", digest, "", "sim")
        self.key_id = int(key.id)

        @world.box.task(name=TASK, key=KEY)
        def booking(ctx: JobContext, n: int) -> None:
            pass

        self.booking = booking
        self.seen: dict[str, Seen] = {}  # what was last seen of each record, by its key
        self.letting_go: set[str] = set()  # claims whose holder lets the key go (5xx, 409)
        self.holding: dict[str, idempotency.Held] = {}  # the requests at work, by actor

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> Mapping[str, Starter]:
        loop = self.world.loop
        clients = {f"api-client-{n}": lambda: loop(self._request) for n in range(1, CLIENTS + 1)}
        return {**clients, "api-pruner": lambda: loop(self._prune)}

    def _request(self) -> None:
        """One POST with an Idempotency-Key, as api/guard.py runs it."""
        world, choices = self.world, self.world.choices
        n = choices.below(ORDERS)
        body = json.dumps({"n": n if choices.below(8) else n + ORDERS}).encode()
        fingerprint = idempotency.fingerprint("POST", PATH, body)
        for _ in range(RETRIES):  # a client told 409 (in flight) retries the same request
            try:
                begun = idempotency.begin(
                    world.store, self.key_id, f"booking-{n}", fingerprint, retain=RETAIN
                )
                break
            except Problem as problem:  # 409 in flight, 422 reused: nothing is written
                if problem.status != 409:
                    return
                world.scheduler.rest(1.0)  # its Retry-After: 1
        else:
            return
        if isinstance(begun, idempotency.Replay):
            return
        me = world.scheduler.current() or ""
        self.holding[me] = begun  # its renewals begin, as `idempotency.kept` starts its thread
        try:
            self._answer(begun, n)
        finally:  # the request ended, or its process died: its renewals stop with it
            self.holding.pop(me, None)

    def _answer(self, begun: idempotency.Held, n: int) -> None:
        world, choices = self.world, self.world.choices
        for _ in range(choices.below(6)):  # the handler at work, a while
            world.scheduler.point("api.at_work")
        ending = choices.below(6)
        if ending in (0, 1):  # the handler failed (a 5xx), or "not yet" (a 409): not kept
            self.letting_go.add(begun.claim)  # before the statement: the checker reads after it
            idempotency.finish(world.store, begun, 500 if ending == 0 else 409, "{}", {})
            return
        job = world.box.enqueue(self.booking, n=n)
        world.wanted.add(KEY.format(n=n))
        idempotency.finish(
            world.store, begun, 201, json.dumps({"job": job.job_id, "created": job.created}), {}
        )

    def time_passed(self) -> None:
        """The holders' renewal threads beat through the clock's move (`idempotency.kept`
        renews every 10 s): each request at work renews its hold, unless its process was
        stalled through the move (one in four, by the seed), and one that lost its key stops."""
        for name, held in sorted(self.holding.items()):
            if self.world.choices.below(4) == 0:
                continue
            renewed = self.world.real.api_request_renew(
                held.key_id, held.idempotency_key, held.claim, idempotency.HOLD
            )
            if not renewed and self.holding.get(name) is held:
                del self.holding[name]  # (a renewal may wait its turn at SQLite's write lock)

    def _prune(self) -> None:
        while self.world.store.api_request_prune(PRUNE_BATCH) == PRUNE_BATCH:
            pass

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        now = self.world.clock_now()
        current: dict[str, Seen] = {
            str(key): (
                str(claim),
                None if status is None else int(status),
                instant(held),
                instant(expires),
            )
            for key, claim, status, held, expires in rows(
                "SELECT idempotency_key, claim, status, held_until, expires_at "
                "FROM oncebox_api_requests"
            )
        }
        found: list[Violation] = []
        for key, (claim, status, held, expires) in sorted(self.seen.items()):
            after = current.get(key)
            if after is not None and (after[:2] == (claim, status) or after[0] == claim):
                continue  # unchanged, or renewed or answered by its own holder
            if expires is not None and expires <= now:
                continue  # expired: pruned, or claimed afresh by the next request
            if status is None and (after is not None or claim not in self.letting_go):
                # taken over (or deleted: pruned) while its holder may still be at work
                if held is None or held > now:
                    found.append(
                        Violation(
                            "H1",
                            f"{key} was taken from a request at work (held until {held}, "
                            f"now {now})",
                        )
                    )
            elif status is not None:
                what = "deleted" if after is None else f"replaced ({after[1]})"
                found.append(
                    Violation("H2", f"{key}'s kept answer {status} was {what} before {expires}")
                )
        self.seen = current
        return found
