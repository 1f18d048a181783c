"""`Retention`: how long each kind of row is kept once it no longer serves, and what each
policy resolves to for one task, channel or schedule.

A row serves while something may still act on it or read through it, and retention never cuts
that short, whatever the setting:

- a job serves until it is finished and every message it wrote is sent or discarded (a dead job
  waits for a replay for ever); then `jobs` (per task: `keep_jobs=`) counts from its finish;
- a sent message's payload — recipients, subject, bodies: the personal data — is needed only to
  look at what was sent; `payloads` (per channel: `keep_payloads=`) drops it and keeps the row;
- a sent message's row — key, receipt, times — serves the period figures through its job and
  holds off a second message with its key; `messages` (per channel: `keep_messages=`) deletes it
  once its job is gone, with its delivery attempts (so it is at least the longest finite job
  retention in force);
- a delivery attempt of a sent message is diagnosis; `delivery_attempts` deletes it earlier;
  a pending, dead or ambiguous message keeps every attempt;
- a provider's delivery event (deliveries/) serves its dedupe while the provider may retry it;
  `provider_events` deletes it (its message keeps the furthest stage it reached);
- the audit log is the operators' record: kept longest (`audit`), and never the entries about a
  dead letter;
- a schedule run is its period's summary, the history: kept for ever by default
  (`schedule_runs`), never within its schedule's catch-up window, never while a job of its
  period remains;
- an intent is the key's tombstone: kept for ever unless its task says `keep_intents=`.

`timedelta.max` (`FOREVER`; or None in `Retention`) keeps a kind for ever. A task or channel
that sets nothing follows the box's `Retention`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime, time, timedelta

from oncebox.jobs.tasks import Task
from oncebox.kernel.durations import check_keep
from oncebox.outbox.channels import Channel
from oncebox.schedules.schedule import Schedule
from oncebox.store.params import PruneKind

#: Keep for ever (as a per-task or per-channel setting, where None means "the box's policy").
FOREVER = timedelta.max
DEFAULT_CATCH_UP_WINDOW = timedelta(days=31)  # a schedule no longer declared: Schedule's default


@dataclass(frozen=True)
class Retention:
    """The box's retention policy; see the module docstring. None or `FOREVER`: for ever."""

    jobs: timedelta | None = timedelta(days=14)
    payloads: timedelta | None = timedelta(days=7)
    messages: timedelta | None = timedelta(days=90)
    delivery_attempts: timedelta | None = timedelta(days=30)
    provider_events: timedelta | None = timedelta(days=30)
    audit: timedelta | None = timedelta(days=730)
    schedule_runs: timedelta | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            check_keep("Retention", f.name, value)
            if value == FOREVER:
                object.__setattr__(self, f.name, None)


@dataclass(frozen=True)
class Plan:
    """The policies in force for one box: what `policy(kind, name)` keeps."""

    retention: Retention
    tasks: Mapping[str, Task]
    channels: Mapping[str, Channel]
    schedules: Mapping[str, Schedule]

    def policy(self, kind: PruneKind, name: str) -> timedelta | None:
        """How long `kind` rows of `name` are kept; None: for ever."""
        r = self.retention
        if kind == "jobs":
            task = self.tasks.get(name)
            return _own(task.keep_jobs if task else None, r.jobs)
        if kind == "intents":
            task = self.tasks.get(name)
            return task.keep_intents if task else None
        if kind in ("payloads", "messages"):
            channel = self.channels.get(name)
            if kind == "payloads":
                return _own(channel.keep_payloads if channel else None, r.payloads)
            keep = _own(channel.keep_messages if channel else None, r.messages)
            return None if keep is None else max(keep, self._longest_jobs())
        if kind == "delivery_attempts":
            return r.delivery_attempts
        if kind == "provider_events":
            return r.provider_events
        if kind == "audit":
            return r.audit
        if r.schedule_runs is None:
            return None
        schedule = self.schedules.get(name)
        window = schedule.catch_up_window if schedule else DEFAULT_CATCH_UP_WINDOW
        return max(r.schedule_runs, window)

    def _longest_jobs(self) -> timedelta:
        """The longest finite job retention in force. A sent message waits for its job, so a
        message retention shorter than that would only make every pass step over the messages
        whose jobs are still kept; it is raised to it. (A task that keeps its jobs for ever keeps
        its messages with them: the pass steps over those.)"""
        kept = [self.retention.jobs] + [t.keep_jobs for t in self.tasks.values()]
        return max((k for k in kept if k is not None and k != FOREVER), default=timedelta(0))


#: A retention at least this long goes by week where a history keeps finished jobs by week.
WEEK = timedelta(weeks=1)


def by_week(keep: timedelta, now: datetime) -> timedelta:
    """A finished job's retention where a history keeps them by week (PostgreSQL, 0025): a
    retention of a week or more is stretched so that its cutoff, `now - keep`, falls on the
    Monday (00:00 UTC) of the week it would fall in. Such a job then goes with its week — up to
    seven days after `keep`, so at most twice as long — and a week whose every task is past its
    retention goes whole (`Store.job_history_drop`) before any batch could take its rows one by
    one. A shorter retention (a day's, for personal data) is kept as it is: its jobs go by
    batches, before their week could."""
    if keep < WEEK:
        return keep
    cutoff = (now - keep).astimezone(UTC)
    monday = datetime.combine(cutoff.date() - timedelta(days=cutoff.weekday()), time(), UTC)
    return now - monday


def _own(own: timedelta | None, default: timedelta | None) -> timedelta | None:
    if own is None:
        return default
    return None if own == FOREVER else own
