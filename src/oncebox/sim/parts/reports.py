"""Delivery reports and the resolver's judgement: a channel whose provider keeps no keys, holds
what it cannot tell, answers lookups with lag and reports every message it took; a reporter that
posts those reports through the receiver's own path; and a second resolver racing the first.

- `alert(n)`, keyed `alert/{n}`, six keys: its handler writes two messages to `sms` (keys 0 to
  4; two recipients) or one to `push` (key 5);
- `sms`: `ReportingProvider` (`sim/reporting.py`), `ambiguity="hold"`, `reports=` with a grace
  of 20 s: an unknown outcome is held, then settled by the provider's event (actor
  `provider`), by the lookup once its lag has passed (actor `resolver`), or by a person;
- `push`: a provider that keeps no keys, `ambiguity="retry"`: an unknown outcome is resent and
  counted as a possible duplicate (`possible_duplicates`);
- actors: `enqueue-alert` (up to three jobs at once); `reporter`, the provider's webhook sender
  (posts one due event a round, chosen among the due ones, so they arrive out of order; now and
  then the same event again, as a provider retries a webhook; through
  `deliveries/receiving.py`, as the HTTP receiver once a signature verified); and `resolver-2`
  (a second worker's resolver, `lanes/assembly.py`). Both run on in the quiet phase, where most
  events come due.

What must hold, after every step:

    M1  a reported stage never moves back: each message's `reported` only advances, whatever
        order its events arrive in; and for each token it is the furthest stage of the events
        the receiver acknowledged, at most the furthest it was sent
    V1  a held send is resent by the resolver only when its provider took none of the copies
        sent since the message was last sent again (or written): a lookup, made once its lag
        had passed, proved the held send never arrived; and the resolver never judges a held
        send a provider event names — the provider had it, and its report is for a person
        (resolved `sent` or `resend` by actor `resolver` on a row an event named the step
        before)
    D4  every duplicate is counted: on a `retry` channel, a message's copies beyond one and
        beyond a person's resends are at most its `possible_duplicates` (a count of possible
        duplicates, not an equality: a resend after an outcome the provider never took counts
        one and delivers none); and the durable `sends_possible_duplicate` equals the rows' sum
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from oncebox.deliveries.events import STAGES
from oncebox.deliveries.receiving import receive_event
from oncebox.deliveries.reports import Reports
from oncebox.jobs.retry import Retry
from oncebox.kernel.errors import OnceboxError, StoreUnavailable
from oncebox.lanes.assembly import build_resolver
from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Part, Rows, Stage, Starter
from oncebox.sim.providers import SimProvider
from oncebox.sim.reporting import LAG, ReportingProvider, furthest

KEY = "alert/{n}"
KEYS = 6
PUSHED = 5  # the key whose message goes to `push`
# Out of 100, how a send of theirs ends (`SimProvider.odds`): half unknown, most of those never
# taken, so that held sends, lookups and resends meet the resolvers, the reports and the people.
ODDS = (30, 33, 35, 36, 70)
GRACE = timedelta(seconds=20)
SECRET_ENV = "ONCEBOX_SIM_SMS_SECRET"  # noqa: S105 (never read: the reporter posts verified)
NOT_A_PERSON = ("resolver", "provider")  # the audit's actors that are lanes, not people
RESENT = ("resolve-resend", "replay")  # a message sent again, by a person or the resolver


class Reported(Part):
    """See the module docstring."""

    name = "reports"
    keep = ("reporter", "resolver-2")

    def __init__(self, world: Stage) -> None:
        self.world = world
        box, choices = world.box, world.choices
        self.sms = ReportingProvider("sms", world.scheduler, choices, world.clock_now, odds=ODDS)
        self.push = SimProvider("push", world.scheduler, choices, world.clock_now, odds=ODDS)
        world.providers.update(sms=self.sms, push=self.push)
        retry = Retry(
            max_attempts=3, base_delay=timedelta(seconds=1), max_delay=timedelta(seconds=10)
        )
        box.channel(
            "sms",
            self.sms,
            retry=retry,
            ambiguity="hold",
            batch_size=2,
            reports=Reports(secret_env=SECRET_ENV, grace=GRACE),
        )
        box.channel("push", self.push, retry=retry, ambiguity="retry", batch_size=2)

        @box.task(key=KEY, retry=retry)
        def alert(ctx: JobContext, n: int) -> None:
            if n == PUSHED:
                ctx.outbox.add("push", {"to": f"device-{n}", "text": "hi"}, suffix="push")
                return
            for to in ("a", "b"):  # two recipients: two messages, two tokens
                ctx.outbox.add("sms", {"to": f"{to}-{n}", "text": "hi"}, suffix=f"sms-{to}")

        self.alert = alert
        # what the receiver acknowledged and what was posted, by token: the stages' places
        self.acked: dict[str, list[str | None]] = {}
        self.posted: dict[str, list[str | None]] = {}
        self.stages: dict[int, int] = {}  # each message's furthest stage as last seen
        self.named: set[int] = set()  # the messages events named, as last seen
        self.held: dict[int, tuple[int, Any]] = {}  # each held message: since which step, when
        self.since: dict[int, int] = {}  # each message's copies when it was last sent again
        self.audited = 0  # the last audit row judged

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> Mapping[str, Starter]:
        loop = self.world.loop
        return {
            "enqueue-alert": lambda: loop(self._enqueue),
            "reporter": lambda: loop(self._report),
            "resolver-2": self._resolver,
        }

    def _enqueue(self) -> None:
        keys = [self.world.choices.below(KEYS) for _ in range(1 + self.world.choices.below(3))]
        self.world.box.enqueue_many(self.alert, [{"n": n} for n in keys])
        self.world.wanted.update(KEY.format(n=n) for n in keys)

    def _resolver(self) -> Any:
        runtime, channels = self.world.box.runtime, self.world.box.channels

        def body() -> None:  # built in the actor's own thread, as a worker builds its lanes
            self.world.loop(build_resolver(runtime, channels).run_once)()

        return body

    def _report(self) -> None:
        """One due event, posted as the receiver handles a verified one; kept to be posted
        again when the store was away, and now and then after it was acknowledged (a
        provider's retry of a webhook whose answer it lost)."""
        due = self.sms.due()
        if not due:
            return
        report = due[self.world.choices.below(len(due))]
        self.posted.setdefault(report.token, []).append(report.stage)
        with contextlib.suppress(StoreUnavailable, OnceboxError):
            receive_event(self.world.box.store, "sms", report.event_id, report.payload())
            self.acked.setdefault(report.token, []).append(report.stage)
            if self.world.choices.below(4) != 0 and report in self.sms.waiting:
                self.sms.waiting.remove(report)

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        sms = rows("SELECT id, token, state, reported FROM oncebox_outbox WHERE channel = 'sms'")
        return self._stages(sms) + self._judged(rows, sms) + self._counted(rows)

    def _stages(self, sms: list[Any]) -> list[Violation]:
        """M1."""
        found: list[Violation] = []
        reached: dict[str, int] = {}
        stages: dict[int, int] = {}
        for row_id, token, _state, reported in sms:
            at = STAGES.index(reported) if reported is not None else -1
            stages[int(row_id)] = at
            reached[str(token)] = max(reached.get(str(token), -1), at)
            was = self.stages.get(int(row_id), -1)
            if at < was:
                found.append(
                    Violation("M1", f"message {row_id} moved back from {STAGES[was]} to {reported}")
                )
        self.stages = stages
        for token, at in sorted(reached.items()):
            low, high = furthest(self.acked.get(token, [])), furthest(self.posted.get(token, []))
            if not low <= at <= high:
                shown = STAGES[at] if at >= 0 else None
                found.append(
                    Violation(
                        "M1",
                        f"a message of sms is at stage {shown}; its acknowledged events reach "
                        f"{STAGES[low] if low >= 0 else None}",
                    )
                )
        return found

    def _judged(self, rows: Rows, sms: list[Any]) -> list[Violation]:
        """V1, on every audit row the last step committed (no send shares a step with a
        resolution: the copies counted now are those of the instant it committed)."""
        found: list[Violation] = []
        copies = self.sms.copies()
        tokens = {int(i): str(t) for i, t, _state, _reported in sms}
        for row_id, token in tokens.items():
            self.since.setdefault(row_id, copies.get(token, 0))
        step, now = len(self.world.scheduler.steps), self.world.clock_now()
        audits = [audit for audit in self._audits(rows) if int(audit[0]) > self.audited]
        for _audit, target, actor, action in audits:
            row_id = int(target)
            if row_id not in tokens:
                continue
            got = copies.get(tokens[row_id], 0)
            if actor == "resolver" and row_id in self.named:
                found.append(
                    Violation(
                        "V1", f"message {row_id} was judged ({action}) though an event named it"
                    )
                )
            if actor == "resolver" and action == "resolve-resend" and got > self.since[row_id]:
                found.append(
                    Violation(
                        "V1",
                        f"message {row_id} was resent by the resolver though the provider took "
                        f"{got - self.since[row_id]} of its copies since it was last sent again",
                    )
                )
            if actor == "resolver" and action == "resolve-resend":
                found += self._proved(row_id, tokens[row_id])
            if action in RESENT:
                self.since[row_id] = got
        if audits:
            self.audited = int(audits[-1][0])
        for row_id, _token, state, _reported in sms:
            if state != "ambiguous":
                self.held.pop(int(row_id), None)
            else:
                self.held.setdefault(int(row_id), (step, now))
        self.named = {
            int(i)
            for (i,) in rows(
                "SELECT DISTINCT outbox_id FROM oncebox_provider_events WHERE outbox_id IS NOT NULL"
            )
        }
        return found

    @staticmethod
    def _audits(rows: Rows) -> list[Any]:
        return rows(
            "SELECT id, target_id, actor, action FROM oncebox_audit "
            "WHERE target_kind = 'delivery' ORDER BY id"
        )

    def _proved(self, row_id: int, token: str) -> list[Violation]:
        """Whether a lookup proved the hold the resolver resent never arrived: a "not_found"
        asked after the hold began, once the search's lag had passed since."""
        held = self.held.get(row_id)
        if held is None:
            return [Violation("V1", f"message {row_id} was resent by the resolver, not held")]
        step, at = held
        if any(
            lookup.token == token
            and lookup.step > step
            and lookup.at >= at + LAG
            and lookup.answer == "not_found"
            for lookup in self.sms.lookups
        ):
            return []
        return [
            Violation(
                "V1",
                f"message {row_id} was resent by the resolver with no lookup that proved its "
                "hold never arrived",
            )
        ]

    def _counted(self, rows: Rows) -> list[Violation]:
        """D4."""
        found: list[Violation] = []
        resent = Counter(
            int(target)
            for _id, target, actor, action in self._audits(rows)
            if action in RESENT and actor not in NOT_A_PERSON
        )
        copies = self.push.copies()
        total = 0
        for row_id, token, counted in rows(
            "SELECT id, token, possible_duplicates FROM oncebox_outbox WHERE channel = 'push'"
        ):
            total += int(counted)
            got = copies.get(str(token), 0)
            if got > 1 + resent[int(row_id)] + int(counted):
                found.append(
                    Violation(
                        "D4",
                        f"message {row_id} (push) reached the outside {got} times; "
                        f"{counted} counted as possible duplicates",
                    )
                )
        # push is the one `retry` channel of the world: only its resends are counted. The read
        # is C1's (`sim/invariants.py`), kept until something commits
        counters = dict(rows("SELECT name, sum(value) FROM oncebox_counters GROUP BY name"))
        durable = counters.get("sends_possible_duplicate")
        if int(durable or 0) != total:
            found.append(
                Violation("D4", f"sends_possible_duplicate counts {durable or 0}, the rows {total}")
            )
        return found
