"""`oncebox plan`: what a schedule's run needs — sends, the rate that fits the delivery window,
consumer lanes, the time to drain — from the store's last period and counters, with every input
labelled measured, declared, given or assumed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click

from oncebox.box import Box
from oncebox.cli.common import (
    app_option,
    box_for_admin,
    db_option,
    json_option,
    print_json,
    reported,
    say,
)
from oncebox.cli.inspect_cmds import hours
from oncebox.kernel.counters import complete
from oncebox.kernel.errors import ConfigurationError
from oncebox.limits.rates import Limit
from oncebox.schedules.plan import Input, Plan, plan
from oncebox.schedules.slo import parse_window


@click.command("plan")
@click.option("--schedule", "name", help="The schedule (default: the only one).")
@click.option("--eligible", type=click.IntRange(1, 10**9), help="Subjects per run.")
@click.option("--attempts", type=click.FloatRange(1, 100), help="Delivery attempts per send.")
@click.option("--window", help="The delivery window, e.g. 4h (default: the schedule's SLO).")
@click.option("--rate", help="The channel's rate limit, e.g. 14/s (default: the app's).")
@click.option("--per-lane", type=click.FloatRange(0.001, 10**6), help="Jobs/s per consumer lane.")
@click.option("--lanes", type=click.IntRange(1, 10_000), help="Consumer lanes you run.")
@app_option
@db_option
@json_option
def plan_command(
    *,
    name: str | None,
    eligible: int | None,
    attempts: float | None,
    window: str | None,
    rate: str | None,
    per_lane: float | None,
    lanes: int | None,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Plan a schedule's run: the sends it takes (eligible x attempts), the rate that fits the
    delivery window, whether the rate limit or the consumers set the pace, the consumer lanes
    needed and the time to drain. Inputs come from the last period and the counters unless
    given; each is labelled."""
    with reported():
        box = box_for_admin(app, db)
        inputs = gather(
            box,
            name,
            eligible=eligible,
            attempts=attempts,
            window=window,
            rate=rate,
            per_lane=per_lane,
            lanes=lanes,
        )
        made = plan(**{k: v for k, v in inputs.items() if k != "schedule"})
    if as_json:
        print_json(shape(inputs, made))
        return
    for line in lines(inputs, made):
        say(line)


def gather(
    box: Box,
    name: str | None,
    *,
    eligible: int | None,
    attempts: float | None,
    window: str | None,
    rate: str | None,
    per_lane: float | None,
    lanes: int | None,
) -> dict[str, Any]:
    store = box.store
    known = [entry[0] for entry in store.schedule_state_list()]
    if name is None:
        if len(known) != 1:
            among = f" ({', '.join(sorted(known))})" if known else ""
            raise ConfigurationError(
                f"give --schedule: the database knows {len(known)} schedules{among}"
            )
        name = known[0]
    elif name not in known:
        raise ConfigurationError(f"no schedule {name!r} in {box.where}")
    latest = next((p for p in store.schedule_period_stats(name, 10) if p.eligible), None)
    counted = complete(store.counter_list())
    slo = store.schedule_slo_list().get(name)
    missing: list[str] = []  # every input the plan needs and cannot find: asked for at once
    if eligible is not None:
        subjects: Input[Any] = Input(eligible, "given")
    elif latest is not None:
        subjects = Input(latest.eligible, "measured", f"{latest.period}'s scan")
    else:
        missing.append(f"--eligible (no period of {name} has a finished scan)")
    if window is not None:
        within: Input[Any] = Input(parse_window(window), "given")
    elif slo is not None:
        within = Input(slo[0], "declared", "the schedule's SLO")
    else:
        missing.append(f"--window (schedule {name} declares no SLO)")
    if missing:
        raise ConfigurationError("give " + " and ".join(missing))
    return {
        "schedule": name,
        "eligible": subjects,
        "attempts": _attempts(attempts, counted),
        "window": within,
        "rate_limit_per_s": _rate(box, rate),
        "per_lane_per_s": _pace(box, name, latest.period if latest else None, per_lane),
        "lanes": Input(lanes, "given") if lanes is not None else Input(1, "assumed"),
    }


def _attempts(given: float | None, counted: dict[str, int]) -> Input[float]:
    if given is not None:
        return Input(given, "given")
    sent = counted["sends_sent"]
    if not sent:
        return Input(1.0, "assumed", "nothing sent yet")
    tries = sent + counted["sends_retried"] + counted["sends_throttled"] + counted["sends_resent"]
    return Input(round(tries / sent, 3), "measured", f"delivery attempts over {sent} sends")


def _rate(box: Box, given: str | None) -> Input[float | None]:
    if given is not None:
        return Input(Limit.parse(given).refill_per_s, "given", given)
    limits = [(lim.refill_per_s, lim.name) for ch in box.channels.values() for lim in ch.limits]
    if not limits:
        return Input(None, "assumed", "no limit known (give --rate, or --app)")
    slowest = min(limits)
    return Input(slowest[0], "declared", f"the channels' tightest limit, {slowest[1]}")


def _pace(box: Box, name: str, period: str | None, given: float | None) -> Input[float | None]:
    if given is not None:
        return Input(given, "given")
    pace = None if period is None else box.store.schedule_period_pace(name, period)
    if pace is None or not pace.done or pace.first_at is None or pace.last_at is None:
        return Input(None, "assumed", "unknown (give --per-lane)")
    span = (pace.last_at - pace.first_at).total_seconds()
    if span <= 0:
        return Input(None, "assumed", "unknown (give --per-lane)")
    per_lane = pace.done / span / max(pace.lanes, 1)
    return Input(
        float(f"{per_lane:.4g}"),
        "measured",
        f"{period}: {pace.done} jobs in {span:.1f} s on {pace.lanes} lane(s)",
    )


def lines(inputs: dict[str, Any], made: Plan) -> list[str]:
    def shown(key: str, value: str) -> str:
        item: Input[Any] = inputs[key]
        return f"  {key.replace('_', ' '):18} {value:14} {item.source}" + (
            f": {item.note}" if item.note else ""
        )

    rate = inputs["rate_limit_per_s"].value
    per_lane = inputs["per_lane_per_s"].value
    out = [
        f"plan for schedule {inputs['schedule']}",
        shown("eligible", str(inputs["eligible"].value)),
        shown("attempts", f"{inputs['attempts'].value:g}"),
        shown("window", hours(inputs["window"].value.total_seconds())),
        shown("rate_limit_per_s", "-" if rate is None else f"{rate:g}/s"),
        shown("per_lane_per_s", "-" if per_lane is None else f"{per_lane:g}/s"),
        shown("lanes", str(inputs["lanes"].value)),
        f"sends              {made.sends}",
        f"needed rate        {made.needed_per_s:.3g}/s to finish within the window",
        f"bottleneck         {made.bottleneck}",
    ]
    if made.lanes_needed is not None:
        out.append(f"lanes needed       {made.lanes_needed}")
    if made.drain is not None:
        verdict = "fits the window" if made.fits else "does NOT fit the window"
        out.append(f"time to drain      {hours(made.drain.total_seconds())}: {verdict}")
    return out


def shape(inputs: dict[str, Any], made: Plan) -> dict[str, Any]:
    def item(key: str) -> dict[str, Any]:
        value = inputs[key].value
        if isinstance(value, timedelta):
            value = value.total_seconds()
        return {"value": value, "source": inputs[key].source, "note": inputs[key].note}

    return {
        "schedule": inputs["schedule"],
        "inputs": {key: item(key) for key in inputs if key != "schedule"},
        "sends": made.sends,
        "needed_per_s": round(made.needed_per_s, 6),
        "bottleneck": made.bottleneck,
        "lanes_needed": made.lanes_needed,
        "drain_s": None if made.drain is None else round(made.drain.total_seconds(), 3),
        "fits": made.fits,
    }
