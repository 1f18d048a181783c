"""Operator actions on jobs and messages: find, replay, cancel, resolve — each audited.

Replays happen in place and keep the key: a dead job goes back to ready with the same id and key
and its history; a dead message goes back to pending with the same key and frozen content. There
is no way to replay under a new key — a new key is a new business operation.

One audited exception frees a key: discarding a dead message whose frozen content no provider
will take (`discard`). Replaying it would fail the same way for ever; discarding it releases
its intent (once none of the intent's messages stands) and makes its job dead again, so a replay
of the job — with the code fixed — writes the message afresh under the same key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from oncebox.clock import monotonic
from oncebox.clock import sleep as clock_sleep
from oncebox.errors import ConfigurationError, InvalidState, NotFound
from oncebox.jobs.keys import validate_key
from oncebox.metrics import Metrics
from oncebox.runtime import Runtime
from oncebox.store.base import (
    DiscardResult,
    JobFilter,
    JobRow,
    OperatorAction,
    OutboxFilter,
    OutboxRow,
    Store,
    reason_text,
)


@dataclass(frozen=True)
class DeadFilter:
    """Which dead letters a batch redrive takes: jobs, deliveries or both, by task or channel."""

    kind: Literal["job", "delivery"] | None = None
    task: str | None = None
    channel: str | None = None
    limit: int = 1000

    def __post_init__(self) -> None:
        """Filters that cannot match anything are a mistake, not an empty result."""
        if self.task is not None and (self.channel is not None or self.kind == "delivery"):
            raise ConfigurationError("--task selects dead jobs; it cannot go with deliveries")
        if self.channel is not None and self.kind == "job":
            raise ConfigurationError("--channel selects dead deliveries; it cannot go with jobs")
        if self.limit < 1:
            raise ConfigurationError("the limit must be at least 1")


@dataclass(frozen=True)
class ActionOutcome:
    """A replay, cancel or resolution that happened, and the audit row that records it.
    `kind` says whether `id` is a job's or an outbox row's ("delivery")."""

    id: int
    key: str | None
    audit_id: int
    kind: Literal["job", "delivery"] = "job"


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
            job = self.store.job_get(int(key_or_id))
            return [job] if job is not None else []
        return self.store.job_find_by_key(validate_key(key_or_id))

    def _target(self, key_or_id: str | int, wanted: str, verb: str, what: str = "job") -> JobRow:
        jobs = self.find(key_or_id)
        if not jobs:
            raise NotFound(f"no {what} with id or key {key_or_id!r}")
        for job in jobs:
            if job.state == wanted:
                return job
        states = ", ".join(f"job {job.id} is {job.state}" for job in jobs)
        raise InvalidState(
            f"cannot {verb} {key_or_id!r}: {states}; only {wanted} jobs can be {_done(verb)}"
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
        most `limit`."""
        found: list[JobRow | OutboxRow] = []
        if where.kind != "delivery" and where.channel is None:
            found += self._page_jobs(where)
        if where.kind != "job" and where.task is None:
            found += self._page_deliveries(where, where.limit)
        found.sort(key=lambda row: (row.created_at, row.id), reverse=True)
        return found[: where.limit]

    def _page_jobs(self, where: DeadFilter) -> list[JobRow]:
        rows: list[JobRow] = []
        while len(rows) < where.limit:
            page = self.store.job_list(
                JobFilter(
                    state="dead",
                    task=where.task,
                    before_id=rows[-1].id if rows else None,
                    limit=min(500, where.limit - len(rows)),
                )
            )
            if not page:
                break
            rows += page
        return rows

    def _page_deliveries(self, where: DeadFilter, limit: int) -> list[OutboxRow]:
        rows: list[OutboxRow] = []
        while len(rows) < limit:
            page = self.store.outbox_list(
                OutboxFilter(
                    state="dead",
                    channel=where.channel,
                    before_id=rows[-1].id if rows else None,
                    limit=min(500, limit - len(rows)),
                )
            )
            if not page:
                break
            rows += page
        return rows

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
        """Redrive many dead letters in place, each audited, at most `per_second` a second: a
        morning-after redrive of a night's failures must not arrive at the workers (and the
        provider) as one burst. A row that stopped being dead meanwhile is reported and skipped."""
        reason = reason_text(reason)
        if not per_second > 0:
            raise ConfigurationError("the redrive rate must be positive")
        gap = 1.0 / per_second
        done: list[ActionOutcome] = []
        next_at = clock()
        for row in self.dead_letters(where):
            wait = next_at - clock()
            if wait > 0:
                sleep(wait)
            next_at = max(next_at, clock()) + gap
            kind: Literal["job", "delivery"] = "job" if isinstance(row, JobRow) else "delivery"
            try:
                outcome = self.replay(row.id, reason=reason, actor=actor, kind=kind)
            except InvalidState as exc:
                on_each(exc)
                continue
            done.append(outcome)
            on_each(outcome)
        return done

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
            row = self.store.outbox_get(int(key_or_id))
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
        if row.uncertain or row.possible_duplicates:
            raise InvalidState(
                f"cannot discard message {row.id} ({row.key}): it may have been delivered "
                "(an earlier send's outcome is unknown), and a re-run could send it twice; "
                "replay it as it is, or leave it dead"
            )
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
        """Cancel a ready job (a pending timer, a queued job); audited. Running jobs are not."""
        reason = reason_text(reason)
        job = self._target(key_or_id, "ready", "cancel")
        result = self.store.job_cancel(OperatorAction(job.id, actor, reason))
        if result is None:
            raise InvalidState(f"job {job.id} stopped being ready while it was being cancelled")
        return ActionOutcome(result.job_id, result.key, result.audit_id)

    # -- working -------------------------------------------------------------------------------


def _is_id(text: str) -> bool:
    """A row id is ASCII digits: `str.isdigit()` is true of "²" too, which `int()` refuses."""
    return text.isascii() and text.isdigit()


def _done(verb: str) -> str:
    """The participle that ends "only dead jobs can be …": replayed, cancelled, resolved."""
    return {"cancel": "cancelled"}.get(verb, verb.removesuffix("e") + "ed")
