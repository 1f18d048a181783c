"""Operator actions on jobs and messages: find, replay, discard, cancel, resolve — each audited.

Replays happen in place and keep the key: a dead job goes back to ready with the same id and key
and its history; a dead message goes back to pending with the same key and frozen content. There
is no way to replay under a new key — a new key is a new business operation.

Two audited ways end a dead letter without replaying it (`discard_dead`). A dead job whose
operation is abandoned becomes `cancelled` in place, its attempts kept; its key is free, as it
never claimed an intent. A dead message whose frozen content no provider will take (`discard`)
is set aside under a renamed key: replaying it would fail the same way for ever; discarding it
releases its intent (once none of the intent's messages stands) and makes its job dead again,
so a replay of the job — with the code fixed — writes the message afresh under the same key.

In bulk, a dry run comes first (`plan_replay`, `plan_discard`: the rows, written nowhere) and
the batch then acts on exactly the rows it listed (`replay_planned`, `discard_planned`); see
`oncebox.jobs.dead_letters`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from oncebox.jobs.dead_letters import (
    DeadFilter,
    DeadLetter,
    DiscardPlan,
    ReplayPlan,
    Skipped,
    check_rate,
    discard_refusal,
    letter_of,
    list_dead,
    list_planned,
    paced,
    why_left,
)
from oncebox.jobs.keys import validate_key
from oncebox.kernel.clock import monotonic
from oncebox.kernel.clock import sleep as clock_sleep
from oncebox.kernel.errors import ConfigurationError, InvalidState, NotFound
from oncebox.kernel.metrics import Metrics
from oncebox.kernel.storable import MAX_ROW_ID, checked_text, is_digits, row_id
from oncebox.runtime.runtime import Runtime
from oncebox.store.params import OperatorAction, reason_text
from oncebox.store.protocol import Store
from oncebox.store.records import DiscardResult, JobRow, OutboxRow

__all__ = [
    "ActionOutcome",
    "BatchOutcome",
    "DeadFilter",
    "DeadLetter",
    "DiscardPlan",
    "Operations",
    "ReplayPlan",
    "Skipped",
]


@dataclass(frozen=True)
class ActionOutcome:
    """A replay, discard, cancel or resolution that happened, and the audit row that records it.
    `kind` says whether `id` is a job's or an outbox row's ("delivery"); for a discarded
    delivery, `discard` says what the discard freed."""

    id: int
    key: str | None
    audit_id: int
    kind: Literal["job", "delivery"] = "job"
    discard: DiscardResult | None = None


@dataclass(frozen=True)
class BatchOutcome:
    """What a batch did to its plan's rows: the actions done, in order, and the planned rows it
    left alone (no longer dead, or changed since the dry run), with why."""

    done: tuple[ActionOutcome, ...]
    skipped: tuple[Skipped, ...]


OnEach = Callable[[ActionOutcome | Skipped], None]


class Operations:
    """Mixed into `Box`: the actions an operator (or the CLI) takes on rows."""

    runtime: Runtime

    @property
    def store(self) -> Store:
        return self.runtime.store

    @property
    def metrics(self) -> Metrics:
        return self.runtime.metrics

    def _wake_local(self) -> None:
        """Wake this process's workers: a replayed job or message is due now."""
        self.runtime.workers.wake()

    def find(self, key_or_id: str | int) -> list[JobRow]:
        """Jobs for a key (its active job and the job that claimed it) or the job with an id."""
        if isinstance(key_or_id, int) or (isinstance(key_or_id, str) and _is_id(key_or_id)):
            found = _row_id(key_or_id)
            job = None if found is None else self.store.job_get(found)
            return [job] if job is not None else []
        return self.store.job_find_by_key(validate_key(key_or_id))

    def _target(
        self, key_or_id: str | int, wanted: str | tuple[str, ...], verb: str, what: str = "job"
    ) -> JobRow:
        jobs = self.find(key_or_id)
        if not jobs:
            raise NotFound(f"no {what} with id or key {key_or_id!r}")
        states_wanted = (wanted,) if isinstance(wanted, str) else wanted
        for job in jobs:
            if job.state in states_wanted:
                return job
        states = ", ".join(f"job {job.id} is {job.state}" for job in jobs)
        raise InvalidState(
            f"cannot {verb} {key_or_id!r}: {states}; only {' or '.join(states_wanted)} jobs can "
            f"be {_done(verb)}"
        )

    def replay(
        self,
        key_or_id: str | int,
        *,
        reason: str,
        actor: str = "api",
        kind: Literal["job", "delivery"] | None = None,
    ) -> ActionOutcome:
        """Replay in place, audited: a dead job back to ready (same id, same key, history
        kept), or a dead outbox row back to pending (same key, same frozen content).

        By key, a dead job is looked for first, then a dead outbox row (by its key, or its
        intent's key when that names exactly one dead row). By id, `kind` says which table
        (default: jobs). There is no replay under a new key. A replayed job whose key was
        claimed meanwhile completes as a duplicate.
        """
        reason = reason_text(reason)
        is_id = isinstance(key_or_id, int) or _is_id(str(key_or_id))
        if kind == "delivery" or (kind is None and not is_id and self._prefers_delivery(key_or_id)):
            row = self._dead_delivery(key_or_id, is_id)
            done = self.store.outbox_replay(OperatorAction(row.id, actor, reason))
            if done is None:
                raise InvalidState(f"outbox row {row.id} stopped being dead while replayed")
            self.metrics.count("deliveries_replayed")
            self._wake_local()
            return ActionOutcome(done.job_id, done.key, done.audit_id, "delivery")
        job = self._target(key_or_id, "dead", "replay", "job" if is_id else "job or outbox row")
        result = self.store.job_replay(OperatorAction(job.id, actor, reason))
        if result is None:
            raise InvalidState(f"job {job.id} stopped being dead while it was being replayed")
        self.metrics.count("jobs_replayed")
        self._wake_local()
        return ActionOutcome(result.job_id, result.key, result.audit_id)

    def dead_letters(self, where: DeadFilter) -> list[JobRow | OutboxRow]:
        """Dead jobs and dead outbox rows matching `where`, newest first across both kinds, at
        most `limit`; the filters run in the store."""
        return list_dead(self.store, where)

    def plan_replay(self, where: DeadFilter) -> ReplayPlan:
        """A dry run of `replay_planned`: exactly the dead letters a batch replay of `where`
        would move, with their count. Writes nothing (no audit row, no state change)."""
        now = self.store.clock_now()
        rows, more = list_planned(self.store, where)
        return ReplayPlan(where, tuple(letter_of(row) for row in rows), now, more)

    def plan_discard(self, where: DeadFilter) -> DiscardPlan:
        """A dry run of `discard_planned`: the dead letters a batch discard of `where` would
        discard, and those it would refuse, with why (a delivery that may have been
        delivered). Writes nothing."""
        now = self.store.clock_now()
        rows, more = list_planned(self.store, where)
        taken: list[DeadLetter] = []
        refused: list[Skipped] = []
        for row in rows:
            why = discard_refusal(row) if isinstance(row, OutboxRow) else None
            if why is None:
                taken.append(letter_of(row))
            else:
                refused.append(Skipped(letter_of(row), why))
        return DiscardPlan(where, tuple(taken), tuple(refused), now, more)

    def replay_planned(
        self,
        plan: ReplayPlan,
        *,
        reason: str,
        actor: str = "api",
        per_second: float = 20.0,
        on_each: OnEach = lambda _item: None,
        sleep: Callable[[float], None] = clock_sleep,
        clock: Callable[[], float] = monotonic,
    ) -> BatchOutcome:
        """Replay exactly the rows of a dry run (`plan_replay`), in its order, at most
        `per_second` a second, each in place and audited in its own transaction. A row that
        stopped being dead since the plan, or was replayed and died again (its attempt count
        moved), is skipped and reported; no row the plan did not list is touched. `on_each` is
        told of each row, as it is done or skipped."""
        if not isinstance(plan, ReplayPlan):
            raise ConfigurationError("replay_planned takes the ReplayPlan of plan_replay")
        rows = paced(plan.rows, per_second, sleep, clock)
        return self._each_planned(
            rows, "replay", self._replay_letter, reason=reason, actor=actor, on_each=on_each
        )

    def _each_planned(
        self,
        rows: Iterable[DeadLetter],
        verb: str,
        act: Callable[[DeadLetter, OperatorAction], ActionOutcome | None],
        *,
        reason: str,
        actor: str,
        on_each: OnEach,
    ) -> BatchOutcome:
        """A batch's loop: each planned row acted on, or skipped with why it was left."""
        reason = reason_text(reason)
        done: list[ActionOutcome] = []
        skipped: list[Skipped] = []
        for letter in rows:
            outcome = act(letter, OperatorAction(letter.id, actor, reason))
            if outcome is None:
                skipped.append(Skipped(letter, why_left(self.store, letter, verb)))
                on_each(skipped[-1])
            else:
                done.append(outcome)
                on_each(outcome)
        return BatchOutcome(tuple(done), tuple(skipped))

    def _replay_letter(self, letter: DeadLetter, action: OperatorAction) -> ActionOutcome | None:
        """One planned row replayed, fenced on its planned attempt count; None if refused."""
        fenced = OperatorAction(action.job_id, action.actor, action.reason, letter.attempt)
        if letter.kind == "job":
            result = self.store.job_replay(fenced)
            counter = "jobs_replayed"
        else:
            result = self.store.outbox_replay(fenced)
            counter = "deliveries_replayed"
        if result is None:
            return None
        self.metrics.count(counter)
        self._wake_local()
        return ActionOutcome(result.job_id, result.key, result.audit_id, letter.kind)

    def replay_dead(
        self,
        where: DeadFilter,
        *,
        reason: str,
        actor: str = "api",
        per_second: float = 20.0,
        on_each: Callable[[ActionOutcome | InvalidState], None] = lambda _outcome: None,
        sleep: Callable[[float], None] = clock_sleep,
        clock: Callable[[], float] = monotonic,
    ) -> list[ActionOutcome]:
        """Redrive many dead letters in place, each audited, at most `per_second` a second: the
        dead letters `where` names now (`plan_replay`), replayed at once (`replay_planned`). A
        row that stopped being dead meanwhile is reported to `on_each` as an `InvalidState`
        and skipped. To show what would move first and act on exactly that, use `plan_replay`
        and `replay_planned`."""
        reason = reason_text(reason)
        check_rate(per_second)  # refused before anything is read

        def told(item: ActionOutcome | Skipped) -> None:
            on_each(InvalidState(item.why) if isinstance(item, Skipped) else item)

        plan = self.plan_replay(where)
        done = self.replay_planned(
            plan,
            reason=reason,
            actor=actor,
            per_second=per_second,
            on_each=told,
            sleep=sleep,
            clock=clock,
        )
        return list(done.done)

    def discard_dead(
        self,
        key_or_id: str | int,
        *,
        reason: str,
        actor: str = "api",
        kind: Literal["job", "delivery"] | None = None,
    ) -> ActionOutcome:
        """Discard a dead letter, audited as `discard`: a dead job whose operation is abandoned
        becomes cancelled in place (attempts kept, its key free for a new enqueue); a dead
        delivery is discarded as by `discard` (what it freed is in the outcome's `discard`).

        By key, a dead job of the key is taken first, then a dead outbox row (as `replay`); by
        id, `kind` says which table (default: jobs). A row that is not dead — a second discard
        by id included — is refused with `InvalidState` and nothing is written."""
        reason = reason_text(reason)
        is_id = isinstance(key_or_id, int) or _is_id(str(key_or_id))
        if kind == "delivery" or (kind is None and not is_id and self._prefers_delivery(key_or_id)):
            freed = self.discard(key_or_id, reason=reason, actor=actor)
            return ActionOutcome(freed.id, freed.key, freed.audit_id, "delivery", freed)
        job = self._target(key_or_id, "dead", "discard", "job" if is_id else "job or outbox row")
        result = self.store.job_discard(OperatorAction(job.id, actor, reason))
        if result is None:
            raise InvalidState(f"job {job.id} stopped being dead while it was being discarded")
        self.metrics.count("jobs_discarded")
        return ActionOutcome(result.job_id, result.key, result.audit_id)

    def discard_planned(
        self,
        plan: DiscardPlan,
        *,
        reason: str,
        actor: str = "api",
        on_each: OnEach = lambda _item: None,
    ) -> BatchOutcome:
        """Discard exactly the rows a dry run (`plan_discard`) would discard — never its refused
        ones — in its order, each audited in its own transaction, as `discard_dead` does. A row
        that stopped being dead since the plan, changed (its attempt count moved), or became one
        that may have been delivered, is skipped and reported. Discards make no work for the
        workers, so they are not paced."""
        if not isinstance(plan, DiscardPlan):
            raise ConfigurationError("discard_planned takes the DiscardPlan of plan_discard")
        return self._each_planned(
            plan.rows, "discard", self._discard_letter, reason=reason, actor=actor, on_each=on_each
        )

    def _discard_letter(self, letter: DeadLetter, action: OperatorAction) -> ActionOutcome | None:
        """One planned row discarded, fenced on its planned attempt count; None if refused."""
        fenced = OperatorAction(action.job_id, action.actor, action.reason, letter.attempt)
        if letter.kind == "job":
            result = self.store.job_discard(fenced)
            if result is None:
                return None
            self.metrics.count("jobs_discarded")
            return ActionOutcome(result.job_id, result.key, result.audit_id)
        freed = self.store.outbox_discard(fenced, letter.key or "")
        if freed is None:
            return None
        self.metrics.count("deliveries_discarded")
        return ActionOutcome(freed.id, freed.key, freed.audit_id, "delivery", freed)

    def _prefers_delivery(self, key: str | int) -> bool:
        """A key names a dead job, else a dead outbox row (a job's key may have both a done
        job and a dead message: the message is what needs replaying)."""
        text = str(key)
        if "~" not in text and any(
            job.state == "dead" for job in self.store.job_find_by_key(validate_key(text))
        ):
            return False
        return any(row.state == "dead" for row in self._outbox_rows(text, False))

    def _outbox_rows(self, key_or_id: str | int, is_id: bool) -> list[OutboxRow]:
        if is_id:
            found = _row_id(key_or_id)
            row = None if found is None else self.store.outbox_get(found)
            return [row] if row is not None else []
        text = str(key_or_id)
        validate_key(text.replace("~", "-"))
        return self.store.outbox_find_by_key(text)

    def _dead_delivery(self, key_or_id: str | int, is_id: bool) -> OutboxRow:
        return self._one_delivery(key_or_id, is_id, "dead", "replay")

    def _one_delivery(self, key_or_id: str | int, is_id: bool, wanted: str, verb: str) -> OutboxRow:
        rows = self._outbox_rows(key_or_id, is_id)
        if not rows:
            raise NotFound(f"no job or outbox row with id or key {key_or_id!r}")
        matching = [row for row in rows if row.state == wanted]
        exact = [row for row in matching if row.key == str(key_or_id) or is_id]
        if len(exact) == 1 or len(matching) == 1:
            return (exact or matching)[0]
        if len(matching) > 1:
            keys = ", ".join(row.key for row in matching)
            raise InvalidState(
                f"{key_or_id!r} names several {wanted} messages ({keys}); {verb} them one by one"
            )
        states = ", ".join(f"{row.key} is {row.state}" for row in rows)
        raise InvalidState(
            f"cannot {verb} {key_or_id!r}: {states}; only {wanted} messages can be {_done(verb)}"
        )

    def resolve(
        self,
        key_or_id: str | int,
        resolution: Literal["sent", "resend"],
        *,
        reason: str,
        actor: str = "api",
        receipt: str | None = None,
    ) -> ActionOutcome:
        """Settle an ambiguous outbox row after checking with the provider or the recipient:
        `sent` (it arrived; record it) or `resend` (it did not; send it again). Audited."""
        if resolution not in ("sent", "resend"):
            raise ConfigurationError("a resolution is 'sent' or 'resend'")
        reason = reason_text(reason)
        if receipt is not None:
            checked_text(receipt, "the receipt")
        is_id = isinstance(key_or_id, int) or _is_id(str(key_or_id))
        row = self._one_delivery(key_or_id, is_id, "ambiguous", "resolve")
        done = self.store.outbox_resolve(OperatorAction(row.id, actor, reason), resolution, receipt)
        if done is None:
            raise InvalidState(f"outbox row {row.id} stopped being ambiguous while resolved")
        if resolution == "resend":
            self._wake_local()
        return ActionOutcome(done.job_id, done.key, done.audit_id, "delivery")

    def discard(self, key_or_id: str | int, *, reason: str, actor: str = "api") -> DiscardResult:
        """Discard a dead message that will never be sent as frozen, audited (see the module
        docstring). Refused for a message that may have been delivered: an unknown outcome, or
        a blind resend, means the recipient may already have it — replay it (same key, same
        content) or leave it dead."""
        reason = reason_text(reason)
        is_id = isinstance(key_or_id, int) or _is_id(str(key_or_id))
        row = self._one_delivery(key_or_id, is_id, "dead", "discard")
        refusal = discard_refusal(row)
        if refusal is not None:
            raise InvalidState(refusal)
        done = self.store.outbox_discard(OperatorAction(row.id, actor, reason), row.key)
        if done is None:
            raise InvalidState(f"outbox row {row.id} stopped being dead while discarded")
        self.metrics.count("deliveries_discarded")
        return done

    def report_duplicate(
        self, key_or_id: str | int, *, reason: str, actor: str = "api"
    ) -> ActionOutcome:
        """Record that a recipient received a sent message twice (a duplicate no automatic
        figure saw: a resend after a lost acknowledgement, a provider's own retry). Audited and
        counted beside the automatic possible duplicates; the message is not changed."""
        reason = reason_text(reason)
        is_id = isinstance(key_or_id, int) or _is_id(str(key_or_id))
        row = self._one_delivery(key_or_id, is_id, "sent", "report")
        done = self.store.outbox_report_duplicate(OperatorAction(row.id, actor, reason))
        if done is None:
            raise InvalidState(f"outbox row {row.id} stopped being sent while it was reported")
        return ActionOutcome(done.job_id, done.key, done.audit_id, "delivery")

    def cancel(
        self, key_or_id: str | int, *, reason: str = "cancelled", actor: str = "api"
    ) -> ActionOutcome:
        """Cancel a ready job (a pending timer, a queued job) or a relayed one (its broker's
        message is then acknowledged unrun, unless a consumer already runs it: then the run's
        settlement loses to the cancel); audited. Leased jobs are not."""
        reason = reason_text(reason)
        job = self._target(key_or_id, ("ready", "relayed"), "cancel")
        result = self.store.job_cancel(OperatorAction(job.id, actor, reason))
        if result is None:
            raise InvalidState(
                f"job {job.id} stopped being {job.state} while it was being cancelled"
            )
        return ActionOutcome(result.job_id, result.key, result.audit_id)

    # -- working -------------------------------------------------------------------------------


def _is_id(text: str) -> bool:
    """A row id is ASCII digits: `str.isdigit()` is true of "²" too, which `int()` refuses."""
    return is_digits(text)


def _row_id(key_or_id: str | int) -> int | None:
    """The id as a number, or None past what any store holds (no row has it)."""
    if isinstance(key_or_id, int):
        return key_or_id if 0 <= key_or_id <= MAX_ROW_ID else None
    return row_id(key_or_id)


def _done(verb: str) -> str:
    """The participle that ends "only dead jobs can be …": replayed, cancelled, resolved."""
    return {"cancel": "cancelled"}.get(verb, verb.removesuffix("e") + "ed")
