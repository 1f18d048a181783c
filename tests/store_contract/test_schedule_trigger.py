"""A schedule fired from outside (an external cron's trigger): the server picks the period from
its own clock and the schedule's cron — the latest fire, or one due within the tolerance — and
fans it out once, however many triggers arrive and whether or not the ticker runs too."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import InvalidState, NotFound
from oncebox.chaos.mutations import mutated
from oncebox.kernel import points
from oncebox.runtime.trigger import Fired, ScheduleTrigger
from oncebox.testing import FrozenClock
from support.digest_schedule import digest_keys, scheduled_box

MONDAY_W33 = datetime(2026, 8, 10, 9, 0, 30, tzinfo=UTC)  # 30 s after the 09:00 fire


def keys(customers: Iterable[int], week: str = "2026-W33") -> list[str]:
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


def die_after_the_answer(box, batches: int) -> None:
    """A server that answered a trigger's 202 and died: its run claimed, `batches` batches
    enqueued (the fan-out killed before the next), nothing finished. No ticker runs anywhere."""
    schedule = box.schedules["weekly-digest"]
    trigger = ScheduleTrigger(box.runtime, "server-that-died")
    fired = trigger.claim(schedule)
    assert fired.claimed, fired
    if batches:
        killed = {"scheduler.between_batches": points.raising(SystemExit(9))}
        with points.installed(killed), pytest.raises(SystemExit):
            trigger.proceed(schedule, fired)
    [run] = box.store.schedule_run_list("weekly-digest")
    assert (run.period, run.state, run.owner) == ("2026-W33", "running", "server-that-died")


def trigger_after_a_dead_fan_out(url: str, batches: int) -> tuple[Fired, list[str]]:
    """The race of item 6: a trigger's fan-out dies after its claim; its lease runs out; the
    next week's trigger arrives. What that trigger did, and every job's key (once each, or
    twice)."""
    box = scheduled_box(url, customers=5, batch_size=2)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_after_the_answer(box, batches)
            clock.advance(timedelta(days=7))  # next Monday's cron; the dead lease ran out
            later = box.fire_schedule("weekly-digest")
        return later, digest_keys(box)
    finally:
        box.close()


@pytest.mark.parametrize("batches", [0, 1], ids=["none-enqueued", "one-batch-enqueued"])
def test_a_trigger_resumes_a_period_whose_fan_out_died_after_the_claim(store_url, batches):
    later, found = trigger_after_a_dead_fan_out(store_url, batches)
    assert found == sorted(keys(range(1, 6)) + keys(range(1, 6), "2026-W34")), found
    assert (later.period, later.claimed) == ("2026-W34", True), later
    assert [(r.period, r.claimed, r.enqueued) for r in later.resumed] == [
        ("2026-W33", True, 5 - 2 * batches)
    ], later.resumed


def test_a_trigger_without_its_resume_loses_a_dead_fan_outs_period(store_url):
    with mutated("trigger-skips-stalled"):
        later, found = trigger_after_a_dead_fan_out(store_url, 1)
    assert later.resumed == (), later
    assert found == sorted(keys([1, 2]) + keys(range(1, 6), "2026-W34")), found  # 3-5 lost


def test_a_triggers_queued_run_is_renewed_while_it_waits_its_turn(store_url, monkeypatch):
    """A trigger claims every stalled run and its own period at once, then fans them out one
    after another: the runs waiting their turn are its own too, renewed meanwhile, so `status`
    does not call their owner gone (nor an operator take them over) while it is at work."""
    from oncebox.schedules import owners
    from oncebox.status import status_data
    from support.waiting import wait_until

    monkeypatch.setattr(owners, "RENEW_EVERY", timedelta(milliseconds=20))
    box = scheduled_box(store_url, customers=5, batch_size=2)
    held_up = points.Pause()
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_after_the_answer(box, 1)
            clock.advance(timedelta(days=7))
            schedule = box.schedules["weekly-digest"]
            trigger = ScheduleTrigger(box.runtime, "the-next-server")
            fired = trigger.claim(schedule)
            assert [r.period for r in fired.resumed] == ["2026-W33"], fired
            fanning = threading.Thread(target=trigger.proceed, args=(schedule, fired))
            with points.installed({"scheduler.between_batches": held_up}):
                fanning.start()
                assert held_up.reached.wait(30)  # W33 resumed, its first batch in; W34 waits
                later = clock.advance(timedelta(minutes=1))

                def queued_renewed() -> object:
                    run = box.store.schedule_run_get("weekly-digest", "2026-W34")
                    return run is not None and run.renewed_at == later

                wait_until(queued_renewed, what="the queued W34 run renewed at the new instant")
                owners_seen = {
                    (f["period"], f["owner"], f["owner_live"])
                    for f in status_data(box, 3)["fan_outs"]
                }
                assert ("2026-W34", "the-next-server", True) in owners_seen, owners_seen
                held_up.release()
                fanning.join(30)
        assert digest_keys(box) == sorted(keys(range(1, 6)) + keys(range(1, 6), "2026-W34"))
    finally:
        held_up.release()
        box.close()
