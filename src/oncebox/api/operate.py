"""What an operator's key may do: replay a dead letter (a reason required, audited under the
key's name) and fire a schedule as an external cron would (`runtime/trigger.py`)."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote

from oncebox import shapes
from oncebox.api.guard import Answer, Call
from oncebox.api.jobs import key_path
from oncebox.api.problems import Problem
from oncebox.kernel.errors import NotFound
from oncebox.lanes.assembly import worker_name
from oncebox.runtime.trigger import ScheduleTrigger


def actor(call: Call) -> str:
    return f"api:{call.key.name}"


def replay(call: Call) -> Answer:
    body = call.body
    reason = body.get("reason") if isinstance(body, dict) else None
    if not isinstance(reason, str) or not reason.strip():
        raise Problem(
            422, "invalid-arguments", 'a replay needs {"reason": "why"}, for the audit log'
        )
    if set(body) - {"reason"}:
        raise Problem(422, "invalid-arguments", "a replay's body holds its reason only")
    outcome = call.box.replay(call.params["key"], reason=reason, actor=actor(call))
    shape: dict[str, Any] = {
        "replayed": outcome.kind,
        "id": outcome.id,
        "key": outcome.key,
        "audit_id": outcome.audit_id,
        "links": {} if outcome.key is None else {"key": key_path(outcome.key)},
    }
    return Answer(200, shape)


def fire(call: Call) -> Answer:
    """202 once this trigger claimed the period's run, or a stalled one it resumes (the
    fan-outs run on after the answer, the resumed first); 200 with `claimed: false` and nothing
    resumed when the run was claimed before — by the ticker or an earlier trigger: nothing more
    is enqueued. A fan-out that fails or dies with its server keeps the run until its lease runs
    out; then the next trigger, or a ticker, claims and resumes it (`resumed`)."""
    name = call.params["name"]
    schedule = call.box.schedules.get(name)
    if schedule is None:
        raise NotFound(f"no schedule named {name[:100]!r}")
    # an owner per trigger: two fan-outs of one server never pass for each other's lease
    owner = worker_name(f"api-fire-{secrets.token_hex(4)}")
    trigger = ScheduleTrigger(call.box.runtime, owner, call.settings.fire_tolerance)
    fired = trigger.claim(schedule)
    shape = {
        "schedule": fired.schedule,
        "period": fired.period,
        "fire_at": shapes.instant(fired.fire_at),
        "now": shapes.instant(fired.now),
        "claimed": fired.claimed,
        "late": fired.fan_out.late,
        "resumed": [run.period for run in fired.resumed],
        "links": {"period": f"/v1/periods/{quote(name, safe='')}/{quote(fired.period, safe='')}"},
    }
    if not fired.proceeds:
        return Answer(200, shape)
    call.defer(lambda: trigger.proceed(schedule, fired))
    return Answer(202, shape)
