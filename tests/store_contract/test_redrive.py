"""Batch redrive of dead letters: in place, audited, filtered, paced — never one burst."""

from __future__ import annotations

import pytest

from oncebox import JobContext, Retry
from oncebox.kernel.errors import ConfigurationError
from oncebox.providers import SendPermanent
from oncebox.runtime.operations import DeadFilter
from oncebox.testing import MemoryProvider, drain


def dead_box(box, jobs: int, messages: int):
    """`jobs` dead jobs of task `fails` and `messages` dead deliveries on channel `email`."""
    provider = MemoryProvider()
    provider.failures = [SendPermanent("550 5.1.1 no such user") for _ in range(messages)]
    box.channel("email", provider=provider)

    @box.task(key="fails/{n}", retry=Retry(max_attempts=1))
    def fails(ctx: JobContext, n: int) -> None:
        raise ValueError(f"poison {n}")

    @box.task(key="mails/{n}")
    def mails(ctx: JobContext, n: int) -> None:
        ctx.outbox.email(to=f"to-{n}@x.example", subject="s", text="t")

    box.enqueue_many(fails, [{"n": n} for n in range(jobs)])
    box.enqueue_many(mails, [{"n": n} for n in range(messages)])
    drain(box, raise_on_failure=False)
    return box


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_a_redrive_replays_every_dead_letter_in_place_at_the_given_rate(box):
    dead_box(box, jobs=3, messages=2)
    before = {(r.id, r.key) for r in box.dead_letters(DeadFilter())}
    assert len(before) == 5
    time = FakeTime()
    done = box.replay_dead(
        DeadFilter(), reason="fixed", actor="ops", per_second=4, sleep=time.sleep, clock=time.clock
    )
    assert {(o.id, o.key) for o in done} == before  # same ids, same keys
    assert sorted(o.kind for o in done) == ["delivery", "delivery", "job", "job", "job"]
    assert time.slept == [0.25] * 4  # five replays, a quarter second apart
    assert box.dead_letters(DeadFilter()) == []
    assert sorted(a.action for a in box.store.audit_list()) == ["replay"] * 5


def test_a_redrive_takes_only_what_its_filters_name(box):
    dead_box(box, jobs=3, messages=2)
    time = FakeTime()
    jobs = box.replay_dead(
        DeadFilter(task="fails", limit=2), reason="r", sleep=time.sleep, clock=time.clock
    )
    assert [o.kind for o in jobs] == ["job", "job"]
    deliveries = box.replay_dead(
        DeadFilter(kind="delivery", channel="email"), reason="r", sleep=time.sleep, clock=time.clock
    )
    assert [o.kind for o in deliveries] == ["delivery", "delivery"]
    assert [r.key for r in box.dead_letters(DeadFilter())] == ["fails/0"]
    assert box.dead_letters(DeadFilter(channel="sms")) == []


def test_a_redrive_without_a_reason_or_with_no_rate_writes_nothing(box):
    dead_box(box, jobs=1, messages=0)
    with pytest.raises(ConfigurationError, match="reason"):
        box.replay_dead(DeadFilter(), reason=" ")
    with pytest.raises(ConfigurationError, match="rate"):
        box.replay_dead(DeadFilter(), reason="r", per_second=0)
    assert len(box.dead_letters(DeadFilter())) == 1
    assert box.store.audit_list() == []
