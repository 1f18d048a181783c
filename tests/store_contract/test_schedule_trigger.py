"""A schedule fired from outside (an external cron's trigger): the server picks the period from
its own clock and the schedule's cron — the latest fire, or one due within the tolerance — and
fans it out once, however many triggers arrive and whether or not the ticker runs too."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import InvalidState, NotFound
from oncebox.schedules.trigger import Fired
from oncebox.testing import FrozenClock
from support.digest_schedule import digest_keys, scheduled_box

MONDAY_W33 = datetime(2026, 8, 10, 9, 0, 30, tzinfo=UTC)  # 30 s after the 09:00 fire


def keys(customers: range, week: str = "2026-W33") -> list[str]:
    return sorted(f"weekly-digest/customer-{c}/{week}" for c in customers)


def test_a_trigger_fans_out_its_latest_fires_period_once(store_url):
    box = scheduled_box(store_url, customers=5)
    try:
        with FrozenClock(box, at=MONDAY_W33 + timedelta(hours=3)):
            first = box.fire_schedule("weekly-digest")
            again = box.fire_schedule("weekly-digest")
            assert box.ticker().run_once().fan_outs == []  # the ticker does not try it again
        assert (first.period, first.fire_at, first.claimed, first.fan_out.enqueued) == (
            "2026-W33",
            datetime(2026, 8, 10, 9, 0, tzinfo=UTC),
            True,
            5,
        )
        assert (again.period, again.claimed, again.fan_out.enqueued) == ("2026-W33", False, 0)
        assert digest_keys(box) == keys(range(1, 6))
    finally:
        box.close()


def test_a_trigger_a_little_early_fires_the_period_it_was_meant_for(store_url):
    box = scheduled_box(store_url, customers=2)
    try:
        early = datetime(2026, 8, 10, 8, 59, 30, tzinfo=UTC)
        with FrozenClock(box, at=early):
            assert box.fire_schedule("weekly-digest", tolerance=timedelta(0)).period == "2026-W32"
            fired = box.fire_schedule("weekly-digest")  # within the minute's tolerance
        assert (fired.period, fired.now) == ("2026-W33", early)
        assert digest_keys(box) == sorted(keys(range(1, 3), "2026-W32") + keys(range(1, 3)))
    finally:
        box.close()


def test_the_ticker_and_concurrent_triggers_fan_a_period_out_once(store_url):
    box = scheduled_box(store_url, customers=6)
    results: list[Fired] = []
    try:
        with FrozenClock(box, at=MONDAY_W33):
            [ticked] = box.ticker().run_once().fan_outs
            threads = [
                threading.Thread(target=lambda: results.append(box.fire_schedule("weekly-digest")))
                for _ in range(4)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        assert ticked.claimed and ticked.enqueued == 6
        assert [(r.period, r.claimed) for r in results] == [("2026-W33", False)] * 4
        assert digest_keys(box) == keys(range(1, 7))
    finally:
        box.close()


def test_a_trigger_is_refused_for_a_paused_or_unknown_schedule_writing_nothing(store_url):
    box = scheduled_box(store_url, customers=3)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            box.fire_schedule("weekly-digest", tolerance=timedelta(0))  # known, then paused
            box.pause_schedule("weekly-digest", reason="customer migration")
            clock.advance(timedelta(weeks=1))
            with pytest.raises(InvalidState, match="is paused: resume it"):
                box.fire_schedule("weekly-digest")
            with pytest.raises(NotFound, match="no schedule named 'monthly'"):
                box.fire_schedule("monthly")
        assert digest_keys(box) == keys(range(1, 4))  # W33 only
    finally:
        box.close()
