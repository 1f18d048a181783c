"""`oncebox plan`: a schedule's run sized from what the store measured — eligible subjects,
attempts per delivery, the pace of a consumer lane — against the delivery window and the
channel's rate limit, every input labelled with where it came from."""

from __future__ import annotations

import json
from datetime import timedelta

from oncebox.schedules.plan import Input, plan
from oncebox.testing import FrozenClock
from test_cli import assert_one_line_error, oncebox
from test_slo import FIRE, deliver, digest_box

HOUR = timedelta(hours=1)


def planned(eligible: int, rate: float | None, per_lane: float | None, lanes: int = 1):
    return plan(
        eligible=Input(eligible, "given"),
        attempts=Input(1.5, "given"),
        window=Input(4 * HOUR, "given"),
        rate_limit_per_s=Input(rate, "given"),
        per_lane_per_s=Input(per_lane, "given"),
        lanes=Input(lanes, "given"),
    )


def test_the_peak_over_the_window_against_a_tight_rate_limit_names_the_limit():
    made = planned(1_000_000, rate=14.0, per_lane=200.0)
    assert made.sends == 1_500_000
    assert round(made.needed_per_s, 2) == 104.17  # 1.5 M sends in 4 h
    assert (made.bottleneck, made.lanes_needed, made.fits) == ("rate limit", 1, False)
    assert made.drain == timedelta(seconds=1_500_000 / 14)


def test_too_few_lanes_name_the_consumers_and_how_many_it_takes():
    made = planned(1_000_000, rate=None, per_lane=20.0, lanes=2)
    assert (made.bottleneck, made.lanes_needed, made.fits) == ("consumers", 6, False)
    enough = planned(1_000_000, rate=None, per_lane=20.0, lanes=6)
    assert (enough.bottleneck, enough.fits) == ("none", True)


def test_an_unknown_pace_plans_the_rate_but_no_drain():
    made = planned(10_000, rate=None, per_lane=None)
    assert (made.drain, made.fits, made.lanes_needed) == (None, None, None)


def test_the_cli_plans_from_the_last_period_and_the_declared_slo(tmp_path):
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    box = digest_box(url, customers=10)
    try:
        with FrozenClock(box, at=FIRE + timedelta(minutes=1)) as clock:
            box.ticker().run_once()
            clock.set(FIRE + HOUR)
            deliver(box, 6)
            clock.set(FIRE + 3 * HOUR)
            deliver(box, 4)
    finally:
        box.close()
    result = oncebox("plan", "--json", "--db", url)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    inputs = shown["inputs"]
    assert (inputs["eligible"]["value"], inputs["eligible"]["source"]) == (10, "measured")
    assert (inputs["window"]["value"], inputs["window"]["source"]) == (14400.0, "declared")
    assert (inputs["attempts"]["value"], inputs["attempts"]["source"]) == (1.0, "measured")
    # 10 jobs from the first lease (10:00) to the last completion (12:00), on one lane
    assert inputs["per_lane_per_s"]["source"] == "measured"
    assert inputs["per_lane_per_s"]["value"] == float(f"{10 / 7200:.4g}")
    assert shown["lanes_needed"] == 1 and shown["fits"] is True
    assert (shown["sends"], shown["bottleneck"]) == (10, "none")
    human = oncebox("plan", "--db", url, "--rate", "1/s")
    assert human.returncode == 0 and "bottleneck         none" in human.stdout
    assert_one_line_error(oncebox("plan", "--db", url, "--schedule", "nope"), 2, "no schedule")
    assert_one_line_error(oncebox("plan", "--db", url, "--rate", "fast"), 2, "rate limit")
