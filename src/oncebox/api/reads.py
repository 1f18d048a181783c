"""What the API reads back: a key's receipt chain, and each schedule's periods — their coverage
and, where an SLO is declared, its judgement — as `oncebox status --json` shows them."""

from __future__ import annotations

from typing import Any

from oncebox import shapes
from oncebox.api.guard import Answer, Call
from oncebox.api.jobs import DIGITS
from oncebox.api.problems import Problem
from oncebox.jobs.receipts import receipt_chain
from oncebox.kernel.errors import ConfigurationError, EnqueueError
from oncebox.schedules.slo import Slo

PERIODS_SHOWN = 12
PERIODS_MAX = 100


def receipts(call: Call) -> Answer:
    key = call.params["key"]
    try:
        chain = receipt_chain(call.box.store, key)
    except (ConfigurationError, EnqueueError) as exc:  # not a key at all: InvalidKey
        raise Problem(400, "malformed-request", str(exc)) from None
    if chain.empty:
        raise Problem(404, "not-found", f"nothing is recorded under key {key[:200]!r}")
    return Answer(200, shapes.receipts(chain))


def _count(call: Call) -> int:
    text = call.query.get("periods", str(PERIODS_SHOWN))
    if not DIGITS.fullmatch(text) or not 1 <= int(text) <= PERIODS_MAX:
        raise Problem(400, "malformed-request", f"periods is a count from 1 to {PERIODS_MAX}")
    return int(text)


def _schedule(call: Call, name: str, count: int) -> dict[str, Any]:
    store = call.box.store
    states = {n: (paused, last) for n, paused, last in store.schedule_state_list()}
    if name not in states and name not in call.box.schedules:
        raise Problem(404, "not-found", f"no schedule named {name[:100]!r}")
    paused, last = states.get(name, (False, None))
    window, target = store.schedule_slo_list().get(name, (None, None))
    slo = None if window is None or target is None else Slo(window, target)
    now = store.clock_now()
    stats = store.schedule_period_stats(name, count, window)
    return {
        "name": name,
        "paused": paused,
        "last_fire_at": shapes.instant(last),
        "slo": None if slo is None else shapes.slo(slo),
        "periods": [
            shapes.period(p, None if slo is None else slo.assess(p, now), schedule=name, now=now)
            for p in stats
        ],
    }


def periods(call: Call) -> Answer:
    count = _count(call)
    names = sorted(
        {n for n, _, _ in call.box.store.schedule_state_list()} | set(call.box.schedules)
    )
    return Answer(200, {"schedules": [_schedule(call, name, count) for name in names]})


def schedule_periods(call: Call) -> Answer:
    return Answer(200, _schedule(call, call.params["schedule"], _count(call)))


def period(call: Call) -> Answer:
    name, wanted = call.params["schedule"], call.params["period"]
    found = _schedule(call, name, PERIODS_MAX)
    for shape in found["periods"]:
        if shape["period"] == wanted:
            return Answer(200, {"schedule": name, "slo": found["slo"], "period": shape})
    raise Problem(
        404,
        "not-found",
        f"schedule {name[:100]!r} has no period {wanted[:60]!r} among its latest {PERIODS_MAX}",
    )
