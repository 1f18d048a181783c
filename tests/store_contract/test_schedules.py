"""Schedules on every store, under the frozen clock: one fan-out per period however many
schedulers run, take-over of a dead one, manual re-runs, catch-up, pausing, overlap."""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import threading
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import Box, InvalidArguments, InvalidState, NotFound
from oncebox.jobs.periods import PeriodKind, iso_week
from oncebox.store.records import ScheduleRunClaim
from oncebox.testing import FrozenClock, drain
from support.digest_schedule import add_customers, digest_keys, scheduled_box
from support.procs import fan_out_and_die

SPAWN = multiprocessing.get_context("spawn")
MONDAY_W33 = datetime(2026, 8, 10, 9, 0, 30, tzinfo=UTC)  # 30 s after the 09:00 fire


def keys(customers, week: str = "2026-W33") -> list[str]:
    return sorted(f"weekly-digest/customer-{c}/{week}" for c in customers)


def test_a_due_period_is_fanned_out_once(store_url, open_box):
    box = scheduled_box(store_url, customers=5)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            ticker = box.ticker()
            [fan_out] = ticker.run_once().fan_outs
            assert (fan_out.period, fan_out.eligible, fan_out.enqueued, fan_out.late) == (
                "2026-W33",
                5,
                5,
                False,
            )
            assert ticker.run_once().fan_outs == []
            clock.advance(timedelta(days=2))
            assert ticker.run_once().fan_outs == []
        assert digest_keys(box) == keys(range(1, 6))
        [run] = box.store.schedule_run_list("weekly-digest")
        assert (run.state, run.scans, run.eligible_count, run.enqueued_count) == ("done", 1, 5, 5)
    finally:
        box.close()


def test_two_schedulers_racing_on_one_period_fan_out_once(store_url):
    boxes = [scheduled_box(store_url, customers=6 if i == 0 else 0) for i in range(2)]
    try:
        with FrozenClock(boxes[0], at=MONDAY_W33):
            tickers = [box.ticker() for box in boxes]
            barrier = threading.Barrier(2)
            results = []

            def tick(ticker) -> None:
                barrier.wait(10)
                results.append(ticker.run_once())

            threads = [threading.Thread(target=tick, args=(t,)) for t in tickers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        claimed = [f for r in results for f in r.fan_outs if f.claimed]
        assert len(claimed) == 1 and claimed[0].enqueued == 6
        assert digest_keys(boxes[0]) == keys(range(1, 7))
        [run] = boxes[0].store.schedule_run_list("weekly-digest")
        assert run.scans == 1
    finally:
        for box in boxes:
            box.close()


@pytest.mark.slow
def test_a_scheduler_killed_half_way_is_taken_over_and_nothing_is_enqueued_twice(store_url):
    box = scheduled_box(store_url, customers=7, batch_size=2)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            dying = SPAWN.Process(target=fan_out_and_die, args=(store_url, 2))
            dying.start()
            dying.join(60)
            assert dying.exitcode == -signal.SIGKILL
            assert digest_keys(box) == keys([1, 2])  # its first batch committed
            [run] = box.store.schedule_run_list("weekly-digest")
            assert run.state == "running"
            assert box.ticker().run_once().fan_outs[0].claimed is False  # its lease is alive
            clock.advance(timedelta(minutes=6))  # past the dead owner's lease
            [fan_out] = box.ticker().run_once().fan_outs
            assert (fan_out.claimed, fan_out.eligible, fan_out.enqueued) == (True, 7, 5)
        assert digest_keys(box) == keys(range(1, 8))
        [run] = box.store.schedule_run_list("weekly-digest")
        assert (run.state, run.eligible_count, run.enqueued_count) == ("done", 7, 7)
    finally:
        box.close()


def test_a_manual_rerun_enqueues_only_the_customer_added_since(store_url):
    box = scheduled_box(store_url, customers=3)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            box.ticker().run_once()
            drain(box)
            add_customers(box, [4])
            clock.advance(timedelta(days=1))
            result = box.run_schedule("weekly-digest", "2026-W33")
            assert (result.eligible, result.enqueued) == (4, 1)
            assert drain(box).completed == 1
        assert digest_keys(box) == keys(range(1, 5))
        [run] = box.store.schedule_run_list("weekly-digest")
        assert (run.scans, run.eligible_count) == (2, 4)  # the latest scan is the denominator
        with pytest.raises(InvalidArguments, match="2026-W54"):
            box.run_schedule("weekly-digest", "2026-W54")
        with pytest.raises(NotFound, match="no schedule named"):
            box.run_schedule("monthly", "2026-08")
    finally:
        box.close()


def test_a_manual_rerun_is_refused_while_the_period_is_being_fanned_out(store_url):
    box = scheduled_box(store_url, customers=1)
    try:
        with FrozenClock(box, at=MONDAY_W33):
            box.store.schedule_run_claim(
                ScheduleRunClaim(
                    "weekly-digest", "2026-W33", MONDAY_W33, "someone-else", timedelta(minutes=5)
                )
            )
            with pytest.raises(InvalidState, match="is running now"):
                box.run_schedule("weekly-digest", "2026-W33")
    finally:
        box.close()


@pytest.mark.parametrize(
    ("policy", "caught_up", "late"),
    [
        ("latest", ["2026-W36"], [True]),
        ("all", ["2026-W34", "2026-W35", "2026-W36"], [True, True, True]),
        ("none", [], []),
    ],
)
def test_a_three_week_outage_under_each_catch_up_policy(store_url, policy, caught_up, late):
    box = scheduled_box(store_url, customers=2, catch_up=policy)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            ticker = box.ticker()
            ticker.run_once()
            clock.advance(timedelta(weeks=3, days=1))  # Tuesday of W36: three fires missed
            after = ticker.run_once()
            assert [f.period for f in after.fan_outs] == caught_up
            assert [f.late for f in after.fan_outs] == late
            clock.set(datetime(2026, 9, 7, 9, 0, 30, tzinfo=UTC))  # Monday W37, on time
            assert [f.period for f in ticker.run_once().fan_outs] == ["2026-W37"]
        expected = ["2026-W33", *caught_up, "2026-W37"]
        assert digest_keys(box) == sorted(k for week in expected for k in keys([1, 2], week))
    finally:
        box.close()


def test_a_paused_schedule_skips_the_fires_that_pass_while_paused(store_url):
    box = scheduled_box(store_url, customers=1)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            ticker = box.ticker()
            ticker.run_once()
            box.pause_schedule("weekly-digest")
            clock.advance(timedelta(weeks=1))
            assert ticker.run_once().fan_outs == []
            clock.advance(timedelta(days=1))
            box.resume_schedule("weekly-digest")
            assert ticker.run_once().fan_outs == []  # W34 passed while paused
            clock.advance(timedelta(days=6))
            assert [f.period for f in ticker.run_once().fan_outs] == ["2026-W35"]
    finally:
        box.close()


@pytest.mark.parametrize(("overlap", "w34"), [("wait", False), ("skip", False), ("parallel", True)])
def test_the_overlap_policy_when_the_previous_period_is_still_running(store_url, overlap, w34):
    box = scheduled_box(store_url, customers=1, overlap=overlap)
    try:
        with FrozenClock(box, at=MONDAY_W33 + timedelta(weeks=1)) as clock:
            ticker = box.ticker()
            box.store.schedule_state("weekly-digest", timedelta(days=8))
            box.store.schedule_run_claim(
                ScheduleRunClaim(  # W33's fan-out, still running
                    "weekly-digest", "2026-W33", MONDAY_W33, "slow-scheduler", timedelta(hours=1)
                )
            )
            result = ticker.run_once()
            periods = [f.period for f in result.fan_outs]
            assert periods == (["2026-W34"] if w34 else [])
            if overlap == "skip":
                assert ("weekly-digest", "2026-W34") in result.skipped
            if overlap == "wait":
                clock.advance(timedelta(hours=1, minutes=1))  # W33's owner died: lease ran out
                # W33's interrupted fan-out is resumed first, then W34's is no longer held up
                assert [f.period for f in ticker.run_once().fan_outs] == ["2026-W33", "2026-W34"]
    finally:
        box.close()


def test_a_job_for_w33_processed_after_the_w34_boundary_keeps_its_w33_key(store_url):
    box = scheduled_box(store_url, customers=1)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            box.ticker().run_once()
            clock.advance(timedelta(weeks=1, days=1))
            assert drain(box).completed == 1
        assert box.store.intent_get("weekly-digest/customer-1/2026-W33") is not None
    finally:
        box.close()


def test_coverage_never_exceeds_one_when_a_rescan_finds_fewer_eligible():
    from oncebox.store.records import PeriodStats

    rescanned = PeriodStats(
        period="2026-W33", state="done", eligible=3, enqueued=5, done=5, covered=5,
        sent=5, pending=0, dead=0, ambiguous=0,
    )  # fmt: skip
    assert rescanned.coverage == 1.0
    assert dataclasses.replace(rescanned, covered=2).coverage == pytest.approx(2 / 3)


SECRET = "test-secret-not-for-production"


ARABIC_2026 = "\u0662\u0660\u0662\u0666"


def test_a_manual_run_of_a_period_that_cannot_be_a_key_claims_nothing(sqlite_url, open_box):
    """A hand-built PeriodKind whose check lets anything through: run_schedule checks the
    period as a key segment too, before the run is claimed."""
    box = open_box(sqlite_url, secret=SECRET)
    lax = PeriodKind("lax", iso_week.of, lambda text: text)

    @box.task(key="digest/{period}")
    def digest(ctx, period: str) -> None:
        pass

    @box.schedule("lax", cron="0 9 * * MON", period=lax, task="digest")
    def eligible(ctx):
        yield {"period": ctx.period}

    for period in (f"{ARABIC_2026}-W33", "2026/W33", "x" * 10**4):
        with pytest.raises(InvalidArguments, match="cannot be part of a key") as caught:
            box.run_schedule("lax", period)
        assert len(str(caught.value)) < 400
    assert box.store.schedule_run_list("lax") == []
    assert box.store.job_count_by_state().counts == {}


def jobs_written(box: Box) -> dict[str, int]:
    return box.store.job_count_by_state().counts


def weekly_box(box: Box) -> None:
    @box.task(key="digest/customer-{customer_id}/{period}")
    def digest(ctx, customer_id: int, period: str) -> None:
        pass

    @box.schedule("weekly", cron="0 9 * * MON", period=iso_week, task="digest")
    def eligible(ctx):
        yield {"customer_id": 1, "period": ctx.period}


def test_a_manual_run_for_a_malformed_week_is_refused_and_writes_no_run_or_job(box: Box):
    weekly_box(box)
    for period in [
        "2026-W00",
        "2026-W54",
        "2027-W53",
        "2026-W5",
        "2026W33",
        "2026-w33",
        "+2026-W33",
        "10000-W01",
        " 2026-W33",
        "2026-W33\n",
        "2026-W-1",
        "",
        "2026-W33/x",
        "2026-08-17",
    ]:
        with pytest.raises(InvalidArguments, match="period"):
            box.run_schedule("weekly", period)
    assert box.store.schedule_run_list("weekly") == []
    assert jobs_written(box) == {}


def test_year_zero_is_invalid_arguments(sqlite_url, open_box):
    box = open_box(sqlite_url, secret=SECRET)
    weekly_box(box)
    with pytest.raises(InvalidArguments, match="0000-W01"):
        box.run_schedule("weekly", "0000-W01")


@pytest.mark.parametrize(
    "period", ["\u0662\u0660\u0662\u0666-W33", "\uff12\uff10\uff12\uff16-W33", "2026-W\u0663\u0663"]
)
def test_non_ascii_digits_in_a_week_are_refused_before_anything_is_written(
    sqlite_url, open_box, period
):
    box = open_box(sqlite_url, secret=SECRET)
    weekly_box(box)
    with pytest.raises(InvalidArguments):
        box.run_schedule("weekly", period)
    assert box.store.schedule_run_list("weekly") == []
