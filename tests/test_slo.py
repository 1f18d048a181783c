"""The delivery-window SLO: a schedule's promise ("deliver within 4 h to 99.5 %"), judged per
period from the rows — on time means covered (job done, every message sent) within the window of
the fire — with the error budget it leaves and, while the window is open, a projection of the
misses at the current rate, so the person on call is paged when the week's promise is at risk,
not on every retry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from oncebox import Box, ConsumerConfig, JobContext, ScheduleContext, Slo
from oncebox.cli.prometheus import StoreCollector
from oncebox.jobs.periods import iso_week
from oncebox.kernel.errors import ConfigurationError
from oncebox.status import status_data
from oncebox.store.records import PeriodStats, ScheduleRunClaim
from oncebox.testing import FrozenClock, MemoryProvider
from support.db import sql

FIRE = datetime(2026, 8, 10, 9, 0, tzinfo=UTC)  # Monday 09:00, 2026-W33


def stats(eligible: int, on_time: int, dead: int = 0, held: int = 0, **more: int) -> PeriodStats:
    """A period with `dead` subjects (a job, or a message, dead) and `held` ones (a send held
    ambiguous); `more` overrides the message counts."""
    return PeriodStats(
        "2026-W33", "done", eligible, eligible, 0, on_time, on_time, 0,
        more.get("dead_messages", dead), more.get("held_messages", held),
        fire_at=FIRE, on_time=on_time, dead_subjects=dead, held_subjects=held,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "window"),
    [("4h", timedelta(hours=4)), ("1h30m", timedelta(minutes=90)), ("90m", timedelta(minutes=90)),
     ("2d", timedelta(days=2)), (timedelta(seconds=30), timedelta(seconds=30))],
)  # fmt: skip
def test_a_window_reads_as_declared(text, window):
    assert Slo(text, 0.99).deliver_within == window


@pytest.mark.parametrize(
    ("window", "target"),
    [("4 hours", 0.99), ("0s", 0.99), ("4h", 1.0), ("4h", 0), ("4h", float("nan")), ("h", 0.9)],
)
def test_a_promise_that_cannot_be_kept_or_read_is_refused(window, target):
    with pytest.raises(ConfigurationError):
        Slo(window, target)


def test_once_the_window_ends_every_subject_not_on_time_is_a_miss():
    slo = Slo("4h", 0.99)  # 200 eligible: 2 may miss
    after = FIRE + timedelta(hours=5)
    kept = slo.assess(stats(200, 198), after)
    assert kept is not None
    assert (kept.closed, kept.allowed_misses, kept.misses, kept.budget_left) == (True, 2, 2, 0)
    assert (kept.sli, kept.at_risk) == (0.99, False)
    broken = slo.assess(stats(200, 197), after)
    assert broken is not None and (broken.budget_left, broken.at_risk) == (-1, True)


def test_while_the_window_is_open_the_waiting_are_projected_at_the_rate_so_far():
    slo = Slo("4h", 0.995)  # 1000 eligible: 5 may miss
    an_hour_in = FIRE + timedelta(hours=1)
    slow = slo.assess(stats(1000, 100, dead=1, held=1), an_hour_in)
    assert slow is not None and not slow.closed
    # 2 certain misses; 898 wait; 100/h for 3 h more brings 300: 598 more will miss
    assert (slow.misses, slow.budget_left, slow.projected_misses) == (2, 3, 600)
    assert slow.at_risk
    fast = slo.assess(stats(1000, 600, dead=1), an_hour_in)
    assert fast is not None
    assert (fast.misses, fast.projected_misses, fast.at_risk) == (1, 1, False)


def test_a_subject_whose_three_messages_died_is_one_miss_not_three():
    slo = Slo("4h", 0.8)  # 10 eligible: 2 may miss
    judged = slo.assess(stats(10, 5, dead=1, dead_messages=3), FIRE + timedelta(hours=1))
    assert judged is not None
    assert (judged.misses, judged.budget_left) == (1, 1)


def test_a_period_without_a_fire_or_a_scan_is_not_judged():
    slo = Slo("4h", 0.99)
    by_hand = PeriodStats("2026-W33", "done", 10, 10, 10, 10, 10, 0, 0, 0, on_time=None)
    assert slo.assess(by_hand, FIRE) is None


def digest_box(url: str, customers: int) -> Box:
    box = Box(url)
    box.init_secret()
    box.channel("email", provider=MemoryProvider())
    sql(box, "CREATE TABLE IF NOT EXISTS customers (id INTEGER PRIMARY KEY)")
    for customer in range(1, customers + 1):
        sql(box, "INSERT INTO customers (id) VALUES (?)", (customer,))

    @box.task(key="weekly-digest/customer-{customer_id}/{period}")
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        ctx.outbox.email(to=f"c{customer_id}@x.example", subject=f"Digest {period}", text="...")

    @box.schedule(
        "weekly-digest", cron="0 9 * * MON", period=iso_week, task=weekly_digest,
        slo=Slo(deliver_within="4h", target=0.8),
    )  # fmt: skip
    def customers_(ctx: ScheduleContext) -> Any:
        for (customer_id,) in ctx.connection.execute("SELECT id FROM customers ORDER BY id"):
            yield {"customer_id": customer_id, "period": ctx.period}

    return box


def deliver(box: Box, jobs: int) -> None:
    consumer = box.consumer(ConsumerConfig(batch_size=jobs))
    try:
        assert consumer.run_once().completed == jobs
    finally:
        consumer.session.close()
    assert box.dispatcher().run_once().sent == jobs


def test_status_judges_each_period_by_the_messages_sent_within_the_window(store_url):
    box = digest_box(store_url, customers=10)  # 80 %: 2 may miss
    try:
        with FrozenClock(box, at=FIRE + timedelta(minutes=1)) as clock:
            assert [f.period for f in box.ticker().run_once().fan_outs] == ["2026-W33"]
            clock.set(FIRE + timedelta(hours=1))
            deliver(box, 6)
            clock.set(FIRE + timedelta(hours=2))
            [period] = status_data(box, 1)["schedules"][0]["periods"]
            assert period["fire_at"] == "2026-08-10T09:00:00Z"
            # 6 on time in 2 h: 6 more in the 2 h left, enough for the 4 waiting
            assert period["slo"] == {
                "window_ends_at": "2026-08-10T13:00:00Z",
                "closed": False,
                "on_time": 6,
                "sli": 0.6,
                "allowed_misses": 2,
                "misses": 0,
                "budget_left": 2,
                "projected_misses": 0,
                "at_risk": False,
            }
            clock.set(FIRE + timedelta(hours=5))  # the other 4 arrive late
            deliver(box, 4)
            [period] = status_data(box, 1)["schedules"][0]["periods"]
            assert period["covered"] == 10
            judged = period["slo"]
            assert (judged["closed"], judged["on_time"], judged["misses"]) == (True, 6, 4)
            assert (judged["budget_left"], judged["at_risk"]) == (-2, True)
            assert status_data(box, 1)["schedules"][0]["slo"] == {
                "deliver_within_s": 14400.0,
                "target": 0.8,
            }
    finally:
        box.close()


def test_a_scrape_during_a_fan_out_leaves_out_what_it_cannot_know_yet(store_url):
    box = digest_box(store_url, customers=3)
    try:
        box.store.schedule_state("weekly-digest", timedelta(minutes=10))
        claimed = box.store.schedule_run_claim(
            ScheduleRunClaim("weekly-digest", "2026-W33", FIRE, "s1", timedelta(minutes=5))
        )
        assert claimed is not None  # a fan-out under way: no eligible count yet
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(box))
        text = generate_latest(registry).decode()  # before: TypeError, every scrape a 500
    finally:
        box.close()
    assert 'oncebox_period_enqueued{period="2026-W33",schedule="weekly-digest"} 0.0' in text
    assert "oncebox_period_eligible{" not in text
