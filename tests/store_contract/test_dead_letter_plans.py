"""Dead letters in bulk, on every store: filters that narrow the set in the store, a dry run
that writes nothing, a batch that acts on exactly the rows the dry run listed — skipping, and
reporting, those that changed since — and the discard of a dead job whose operation is
abandoned."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import Box, JobContext, Retry, ScheduleContext
from oncebox.jobs.periods import iso_week
from oncebox.kernel.errors import ConfigurationError, InvalidState, NotFound
from oncebox.outbox.transitions import OutboxFinish
from oncebox.providers import SendPermanent
from oncebox.runtime.operations import (
    ActionOutcome,
    BatchOutcome,
    DeadFilter,
    DiscardPlan,
    ReplayPlan,
    Skipped,
)
from oncebox.store.params import JobFilter, OutboxFilter
from oncebox.testing import FrozenClock, MemoryProvider, drain
from support.contract import finish_outbox, outbox_insert, write_outbox

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)  # a Monday
W33, W34 = "2026-W33", "2026-W34"


class FakeTime:
    """The pacing's clock and sleep: a sleep moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def letters(box: Box) -> Iterator[FrozenClock]:
    """At T0 + 6 h: the weekly fan-out's jobs of 2026-W33 died at T0 (6 h ago), those of
    2026-W34 at T0 + 5 h, and two messages a minute later. Job n = 1 of each week died of
    "SMTP 550 No Such User", the others of a KeyError; the messages of "550 5.1.1 no such
    user"."""
    provider = MemoryProvider()
    provider.failures = [SendPermanent("550 5.1.1 no such user") for _ in range(2)]
    box.channel("email", provider=provider)

    @box.task(key="digest/{n}/{period}", retry=Retry(max_attempts=1))
    def digest(ctx: JobContext, n: int, period: str) -> None:
        if n == 1:
            raise ValueError(f"SMTP 550 No Such User (customer {n})")
        raise KeyError("email")

    @box.task(key="mails/{n}")
    def mails(ctx: JobContext, n: int) -> None:
        ctx.outbox.email(to=f"to-{n}@x.example", subject="s", text="t")

    @box.schedule("weekly", cron="0 9 * * MON", period=iso_week, task="digest")
    def everyone(ctx: ScheduleContext) -> Iterator[dict[str, object]]:
        for n in range(3):
            yield {"n": n, "period": ctx.period}

    with FrozenClock(box, at=T0) as clock:
        box.run_schedule("weekly", W33)
        drain(box, raise_on_failure=False)
        clock.advance(timedelta(hours=5))
        box.run_schedule("weekly", W34)
        drain(box, raise_on_failure=False)
        clock.advance(timedelta(minutes=1))
        box.enqueue_many(mails, [{"n": 0}, {"n": 1}])
        drain(box, raise_on_failure=False)
        clock.advance(timedelta(minutes=59))
        yield clock


def keys(rows: object) -> list[str | None]:
    return sorted(row.key for row in rows)  # type: ignore[attr-defined]


def test_each_filter_narrows_the_dead_letters_in_the_store_and_they_combine(box, letters):
    def found(**where: object) -> list[str | None]:
        return keys(box.dead_letters(DeadFilter(**where)))  # type: ignore[arg-type]

    everything = found()
    assert len(everything) == 8
    assert found(error="no such USER") == [
        "digest/1/2026-W33",
        "digest/1/2026-W34",
        "mails/0",
        "mails/1",
    ]
    assert found(period=W33) == ["digest/0/2026-W33", "digest/1/2026-W33", "digest/2/2026-W33"]
    assert found(older_than=timedelta(hours=2)) == found(period=W33)
    assert found(newer_than=timedelta(hours=2)) == [
        "digest/0/2026-W34",
        "digest/1/2026-W34",
        "digest/2/2026-W34",
        "mails/0",
        "mails/1",
    ]
    # combined: each filter narrows what the others leave
    assert found(error="no such user", older_than=timedelta(hours=2)) == ["digest/1/2026-W33"]
    assert found(kind="delivery", error="550") == ["mails/0", "mails/1"]
    assert found(task="digest", error="KeyError", newer_than=timedelta(hours=2)) == [
        "digest/0/2026-W34",
        "digest/2/2026-W34",
    ]
    assert found(channel="email", period=W34) == []  # the messages' job had no period
    assert found(error="no such user", limit=1) == ["mails/1"]  # newest first
    # the listing is still newest first across both kinds
    rows = box.dead_letters(DeadFilter())
    assert [r.created_at for r in rows] == sorted((r.created_at for r in rows), reverse=True)


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        ({"error": "  "}, "--error is empty"),
        ({"period": ""}, "--period is empty"),
        ({"older_than": timedelta(seconds=-1)}, "--older-than cannot be negative"),
        ({"newer_than": timedelta(0)}, "--newer-than 0 matches nothing"),
        (
            {"older_than": timedelta(hours=2), "newer_than": timedelta(minutes=90)},
            "--older-than 2h with --newer-than 1h30m matches nothing",
        ),
        ({"task": "t", "kind": "delivery", "error": "x"}, "--task selects dead jobs"),
    ],
)
def test_a_filter_that_cannot_match_is_a_configuration_error(where, needle):
    with pytest.raises(ConfigurationError, match=needle.replace("(", r"\(")):
        DeadFilter(**where)


def snapshot(box: Box) -> tuple[int, list[tuple[int, str]], list[tuple[int, str]]]:
    """Audit rows, and every job's and message's state: what a dry run must leave as it was."""
    jobs = [(j.id, str(j.state)) for j in box.store.job_list(JobFilter(limit=1000))]
    messages = [(m.id, str(m.state)) for m in box.store.outbox_list(OutboxFilter(limit=1000))]
    return len(box.store.audit_list(limit=1000)), jobs, messages


def test_a_replay_dry_run_lists_exactly_what_would_move_and_writes_nothing(box, letters):
    before = snapshot(box)
    plan = box.plan_replay(DeadFilter(error="no such user"))
    assert snapshot(box) == before
    assert isinstance(plan, ReplayPlan) and plan.count == 4 and not plan.more
    assert plan.planned_at == T0 + timedelta(hours=6)
    assert [(r.kind, r.key, r.task, r.channel) for r in plan.rows] == [
        ("delivery", "mails/1", None, "email"),
        ("delivery", "mails/0", None, "email"),
        ("job", "digest/1/2026-W34", "digest", None),
        ("job", "digest/1/2026-W33", "digest", None),
    ]
    assert all("550" in (r.last_error or "") for r in plan.rows)
    late = T0 + timedelta(hours=5)
    assert [r.died_at for r in plan.rows] == [late + timedelta(minutes=1)] * 2 + [late, T0]
    assert [r.attempt for r in plan.rows] == [1, 1, 1, 1]
    capped = box.plan_replay(DeadFilter(error="no such user", limit=3))
    assert (capped.count, capped.more) == (3, True)
    assert capped.rows == plan.rows[:3]


def test_a_planned_replay_replays_exactly_the_planned_rows_and_skips_one_replayed_meanwhile(
    box, letters
):
    plan = box.plan_replay(DeadFilter(error="no such user"))
    by_key = {r.key: r for r in plan.rows}
    # between the dry run and the confirmation: ops-bob replays one planned row by hand, and a
    # new dead letter that the filter matches appears
    late = box.enqueue("digest", n=1, period="2026-W35")
    drain(box, raise_on_failure=False)
    assert box.store.job_get(late.job_id).state == "dead"
    box.replay("digest/1/2026-W33", reason="by hand", actor="ops-bob")
    time = FakeTime()
    told: list[ActionOutcome | Skipped] = []
    outcome = box.replay_planned(
        plan,
        reason="relay fixed",
        actor="ops-ann",
        per_second=2,
        on_each=told.append,
        sleep=time.sleep,
        clock=time.clock,
    )
    assert isinstance(outcome, BatchOutcome)
    assert [(o.kind, o.id, o.key) for o in outcome.done] == [
        (r.kind, r.id, r.key) for r in plan.rows if r.key != "digest/1/2026-W33"
    ]
    [skipped] = outcome.skipped
    assert skipped.letter == by_key["digest/1/2026-W33"]
    assert "is ready; only dead jobs can be replayed" in skipped.why
    assert told == [*outcome.done, skipped]  # as each was done, in the plan's order
    assert time.slept == [0.5] * 3  # four rows, half a second apart
    audit = box.store.audit_list(limit=100)
    assert sorted((a.actor, a.action, a.target_key) for a in audit) == sorted(
        [("ops-bob", "replay", "digest/1/2026-W33")]
        + [("ops-ann", "replay", o.key) for o in outcome.done]
    )
    # every other dead letter is untouched, whatever the filter would match now
    still_dead = keys(box.dead_letters(DeadFilter()))
    assert still_dead == [
        "digest/0/2026-W33",
        "digest/0/2026-W34",
        "digest/1/2026-W35",
        "digest/2/2026-W33",
        "digest/2/2026-W34",
    ]
    # a second run of the same plan replays nothing twice
    again = box.replay_planned(plan, reason="again", sleep=time.sleep, clock=time.clock)
    assert again.done == () and len(again.skipped) == 4
    assert len(box.store.audit_list(limit=100)) == len(audit)


def test_a_planned_replay_skips_a_row_replayed_and_dead_again_since_the_dry_run(box, letters):
    plan = box.plan_replay(DeadFilter(period=W33, error="KeyError"))
    assert keys(plan.rows) == ["digest/0/2026-W33", "digest/2/2026-W33"]
    box.replay("digest/0/2026-W33", reason="try", actor="ops-bob")
    drain(box, raise_on_failure=False)  # it dies again: a failure nobody confirmed
    assert box.find("digest/0/2026-W33")[0].state == "dead"
    time = FakeTime()
    outcome = box.replay_planned(plan, reason="fixed", sleep=time.sleep, clock=time.clock)
    assert [o.key for o in outcome.done] == ["digest/2/2026-W33"]
    [skipped] = outcome.skipped
    assert skipped.letter.key == "digest/0/2026-W33"
    assert "died again since the dry run (attempt 2, planned at 1)" in skipped.why
    assert box.find("digest/0/2026-W33")[0].state == "dead"


def test_a_batch_refuses_a_plan_of_the_other_kind_and_a_bad_reason_or_rate(box, letters):
    replay, discard = box.plan_replay(DeadFilter()), box.plan_discard(DeadFilter())
    with pytest.raises(ConfigurationError, match="ReplayPlan"):
        box.replay_planned(discard, reason="r")
    with pytest.raises(ConfigurationError, match="DiscardPlan"):
        box.discard_planned(replay, reason="r")
    with pytest.raises(ConfigurationError, match="reason"):
        box.replay_planned(replay, reason=" ")
    with pytest.raises(ConfigurationError, match="rate"):
        box.replay_planned(replay, reason="r", per_second=0)
    assert box.store.audit_list() == [] and len(box.dead_letters(DeadFilter())) == 8


def test_discarding_a_dead_job_cancels_it_keeps_its_attempts_and_frees_its_key(box, letters):
    key = "digest/0/2026-W33"
    [job] = box.find(key)
    outcome = box.discard_dead(key, reason="customer left", actor="ops-ann")
    assert (outcome.kind, outcome.id, outcome.key, outcome.discard) == ("job", job.id, key, None)
    discarded = box.store.job_get(job.id)
    assert discarded is not None
    assert (discarded.state, discarded.attempt, discarded.last_error) == (
        "cancelled",
        1,
        job.last_error,
    )
    assert [a.outcome for a in box.store.job_attempt_list(job.id)] == ["dead"]
    [audit] = box.store.audit_list(job.id)
    assert (audit.id, audit.action, audit.actor, audit.reason) == (
        outcome.audit_id,
        "discard",
        "ops-ann",
        "customer left",
    )
    # a second discard is refused and writes nothing: by id it is not dead any more; by key,
    # no dead job holds the key
    with pytest.raises(InvalidState, match="is cancelled; only dead jobs can be discarded"):
        box.discard_dead(job.id, reason="again")
    with pytest.raises(NotFound):
        box.discard_dead(key, reason="again")
    assert len(box.store.audit_list(job.id)) == 1
    # the key is free: the operation can be enqueued afresh
    again = box.enqueue("digest", n=0, period=W33)
    assert again.created and again.job_id != job.id


def test_discard_dead_of_a_delivery_discards_the_message_and_reopens_its_job(box, letters):
    outcome = box.discard_dead("mails/0", reason="content no relay takes", actor="ops-ann")
    assert (outcome.kind, outcome.key) == ("delivery", "mails/0")
    assert outcome.discard is not None and outcome.discard.renamed.startswith("mails/0~discarded")
    reopened = outcome.discard.job_reopened
    assert reopened is not None and box.store.job_get(reopened).state == "dead"
    with pytest.raises(InvalidState):
        box.discard_dead(outcome.id, kind="delivery", reason="again")
    assert [a.action for a in box.store.audit_list(limit=10)] == ["discard"]


def uncertain_dead_message(box: Box, key: str) -> int:
    """A dead message whose earlier send's outcome was unknown: it may have been delivered."""
    [outbox_id] = write_outbox(box.store, outbox_insert(key, channel="sms"))
    finish = OutboxFinish(outbox_id, "dead", "dead", True, error="timeout", uncertain=True)
    finish_outbox(box.store, outbox_id, finish)
    return outbox_id


def test_a_discard_dry_run_lists_what_it_would_refuse_and_why_and_writes_nothing(box, letters):
    maybe_sent = uncertain_dead_message(box, "sms/1")
    before = snapshot(box)
    plan = box.plan_discard(DeadFilter(kind="delivery"))
    assert snapshot(box) == before
    assert isinstance(plan, DiscardPlan)
    assert (plan.count, keys(plan.rows)) == (2, ["mails/0", "mails/1"])
    [refused] = plan.refused
    assert (refused.letter.id, refused.letter.key) == (maybe_sent, "sms/1")
    assert "it may have been delivered" in refused.why


def test_a_planned_discard_discards_exactly_the_planned_rows(box, letters):
    maybe_sent = uncertain_dead_message(box, "sms/1")
    plan = box.plan_discard(DeadFilter(error="no such user"))
    assert keys(plan.rows) == ["digest/1/2026-W33", "digest/1/2026-W34", "mails/0", "mails/1"]
    box.replay("digest/1/2026-W34", reason="by hand", actor="ops-bob")  # meanwhile
    told: list[ActionOutcome | Skipped] = []
    outcome = box.discard_planned(plan, reason="abandoned", actor="ops-ann", on_each=told.append)
    assert sorted(o.key for o in outcome.done) == ["digest/1/2026-W33", "mails/0", "mails/1"]
    assert [(s.letter.key, "is ready" in s.why) for s in outcome.skipped] == [
        ("digest/1/2026-W34", True)
    ]
    assert len(told) == 4
    # the messages' jobs are dead again (to re-run once fixed) but were not in the plan: kept
    reopened = [o.discard.job_reopened for o in outcome.done if o.discard is not None]
    assert len(reopened) == 2
    assert all(box.store.job_get(j).state == "dead" for j in reopened if j)
    assert box.store.outbox_get(maybe_sent).state == "dead"
    discards = [a for a in box.store.audit_list(limit=100) if a.action == "discard"]
    assert sorted(a.target_key for a in discards) == ["digest/1/2026-W33", "mails/0", "mails/1"]
    assert {a.actor for a in discards} == {"ops-ann"}
