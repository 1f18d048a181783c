"""`oncebox schedule list|run|pause|resume`: the periodic fan-outs."""

from __future__ import annotations

from typing import Any

import click

from oncebox import shapes
from oncebox.cli.common import (
    actor_option,
    app_option,
    box_for_admin,
    db_option,
    fail,
    json_option,
    load_app,
    owner_state,
    print_json,
    print_table,
    reason_option,
    reported,
    say,
)
from oncebox.kernel.errors import NotFound
from oncebox.shapes import instant
from oncebox.store.params import Audit, reason_text


@click.group()
def schedule() -> None:
    """Schedules: one fan-out per period, however many schedulers run."""


@schedule.command("list")
@app_option
@db_option
@json_option
def schedule_list(app: str | None, db: str | None, as_json: bool) -> None:
    """Every schedule: its definition (with --app), whether it is paused, its last and next
    fire."""
    with reported():
        box = box_for_admin(app, db)
        now = box.store.clock_now()
        states = {name: (paused, last) for name, paused, last in box.store.schedule_state_list()}
        defined = box.schedules
        rows: list[dict[str, Any]] = []
        for name in sorted(set(states) | set(defined)):
            paused, last = states.get(name, (False, None))
            definition = defined.get(name)
            runs = box.store.schedule_run_list(name, 1) if name in states else []
            rows.append(
                {
                    "name": name,
                    "cron": definition.cron if definition else None,
                    "tz": definition.tz if definition else None,
                    "period": definition.period.name if definition else None,
                    "task": definition.task if definition else None,
                    "paused": paused,
                    "last_fire_at": instant(last),
                    "last_fan_out": (
                        {
                            "period": runs[0].period,
                            "fire_at": instant(runs[0].fire_at),
                            "state": runs[0].state,
                        }
                        if runs
                        else None
                    ),
                    "next_fire_at": instant(definition.next_fire(now)) if definition else None,
                }
            )
    if as_json:
        print_json(rows)
        return
    print_table(
        [
            "NAME",
            "CRON",
            "TZ",
            "PERIOD",
            "TASK",
            "PAUSED",
            "LAST FAN-OUT",
            "CHECKED TO",
            "NEXT FIRE",
        ],
        [
            [
                r["name"],
                r["cron"],
                r["tz"],
                r["period"],
                r["task"],
                "yes" if r["paused"] else "no",
                (
                    f"{r['last_fan_out']['period']} ({r['last_fan_out']['state']})"
                    if r["last_fan_out"]
                    else "none yet"
                ),
                r["last_fire_at"],
                r["next_fire_at"],
            ]
            for r in rows
        ],
        "no schedules",
    )


@schedule.command("run")
@click.argument("name")
@click.option("--period", required=True, metavar="PERIOD", help="e.g. 2026-W33.")
@click.option(
    "--take-over",
    is_flag=True,
    help="The period's fan-out is running and its owner is gone (status says so): take its run "
    "over now instead of waiting out its lease, and finish it. Needs --reason. Audited.",
)
@click.option("--reason", help="With --take-over: why; written to the audit log.")
@actor_option
@app_option
@db_option
@json_option
def schedule_run(
    *,
    name: str,
    period: str,
    take_over: bool,
    reason: str | None,
    actor: str,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Fan out one period again: scans eligibility and enqueues only keys that are neither
    claimed nor active (a re-run never sends twice). With --take-over, first take the period's
    running fan-out from an owner that is gone."""
    if take_over and reason is None:
        fail("Missing option '--reason': why the run is taken over, written to the audit log", 2)
    if reason is not None and not take_over:
        fail("--reason goes with --take-over", 2)
    with reported():
        box = load_app(app, db)
        taken = (
            box.take_over_schedule_run(name, period, reason=reason or "", actor=actor)
            if take_over
            else None
        )
        result = box.run_schedule(name, period) if taken is None else taken.fan_out
    shape: dict[str, Any] = {
        "schedule": result.schedule,
        "period": result.period,
        "eligible": result.eligible,
        "enqueued": result.enqueued,
        "already_claimed_or_active": result.eligible - result.enqueued,
    }
    if taken is not None:  # whose run it was, as judged when it was taken
        previous = shapes.fan_out(name, period, taken.previous)
        shape["taken_over"] = {**previous, "audit_id": taken.audit_id}
    if as_json:
        print_json(shape)
        return
    if taken is not None:
        say(
            f"{name} {period}: taken over from {taken.previous.owner}, "
            f"{owner_state(previous, taken.previous.now)}; audit #{taken.audit_id}"
        )
    say(
        f"{name} {period}: {result.eligible} eligible, {result.enqueued} enqueued, "
        f"{result.eligible - result.enqueued} already claimed or active"
    )


def _set_paused(
    name: str, paused: bool, *, reason: str, actor: str, app: str | None, db: str | None
) -> None:
    with reported():
        box = box_for_admin(app, db)
        known = set(box.schedules) | {n for n, _p, _l in box.store.schedule_state_list()}
        if name not in known:
            raise NotFound(
                f"no schedule named {name!r} (known: {', '.join(sorted(known)) or 'none'})"
            )
        box.store.schedule_state_pause(name, paused, Audit(actor, reason_text(reason)))
    say(f"{name} {'paused' if paused else 'resumed (fires that passed are skipped)'}")


@schedule.command("pause")
@click.argument("name")
@reason_option
@actor_option
@app_option
@db_option
def schedule_pause(*, name: str, reason: str, actor: str, app: str | None, db: str | None) -> None:
    """Stop fanning out NAME; jobs already enqueued still run. Audited."""
    _set_paused(name, True, reason=reason, actor=actor, app=app, db=db)


@schedule.command("resume")
@click.argument("name")
@reason_option
@actor_option
@app_option
@db_option
def schedule_resume(*, name: str, reason: str, actor: str, app: str | None, db: str | None) -> None:
    """Fan out NAME again from now on; fires that passed while paused are skipped (run one with
    `schedule run NAME --period P`). Audited."""
    _set_paused(name, False, reason=reason, actor=actor, app=app, db=db)
