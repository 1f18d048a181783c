"""`oncebox status`, `oncebox jobs list|show`, `oncebox audit list`: read-only views."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import click

from oncebox import shapes
from oncebox.cli.common import (
    actor_option,
    age,
    app_option,
    backlog_lines,
    before_option,
    box_for_admin,
    db_option,
    fan_out_line,
    id_or_key,
    json_option,
    limit_option,
    print_json,
    print_table,
    reason_option,
    reported,
    say,
)
from oncebox.cli.prune_cmd import HEADERS, retention_table
from oncebox.jobs.keys import validate_key
from oncebox.kernel.errors import NotFound
from oncebox.status import JOB_STATES, OUTBOX_STATES, status_data
from oncebox.store.params import AuditFilter, JobFilter

PERIOD_HEADERS = [
    "PERIOD",
    "STATE",
    "ELIGIBLE",
    "ENQUEUED",
    "SENT",
    "PENDING",
    "DEAD",
    "AMBIGUOUS",
    "COVERAGE",
]
LIMIT_HEADERS = ["LIMIT", "PARTITION", "DECLARED", "RUNNING", "WAITING", "OLDEST WAIT"]


def limits_table(entries: list[dict[str, Any]], now: datetime) -> list[list[str]]:
    """Each limit as a whole, then the partitions that wait longest (`shapes.limits_shown`)."""
    rows = []
    for entry in shapes.limits_shown(entries):
        whole = entry["partition"] is None
        wait = entry["oldest_wait_s"]
        rows.append(
            [
                entry["limit"] if whole else "",
                "all" if whole else entry["partition"],
                entry["declared"] if whole else "",
                str(entry["running"]),
                f"{entry['waiting']}{'+' if entry['waiting_capped'] else ''}",
                "-" if wait is None else age(now - timedelta(seconds=wait), now),
            ]
        )
    return rows


@click.command()
@click.option(
    "--periods",
    type=click.IntRange(1, 100),
    default=3,
    show_default=True,
    help="Recent periods shown per schedule.",
)
@app_option
@db_option
@json_option
def status(periods: int, app: str | None, db: str | None, as_json: bool) -> None:
    """Queue depth, ages, dead letters, ambiguous sends, and each schedule's recent periods with
    their coverage (covered jobs over eligible customers)."""
    with reported():
        box = box_for_admin(app, db)
        data = status_data(box, periods)
        clock_setting = box.store.clock_get()
    if as_json:
        print_json(data)
        return
    now = datetime.fromisoformat(data["now"])
    oldest = data["oldest_due_ready_age_s"]
    pending_age = data["oldest_pending_message_age_s"]
    jobs, outbox = data["jobs"], data["outbox"]
    if data["clock"]["mode"] != "real":  # first: every other figure is read on this clock
        say(
            f"CLOCK      {clock_setting.describe()}; workers refuse it — if its owner is gone: "
            "oncebox clock reset --reason ..."
        )
    say(f"database   {data['database']} (schema {data['schema_version']})")
    say(
        "jobs       "
        + ", ".join(f"{state} {jobs[state]}" for state in JOB_STATES)
        + (
            f"; oldest due job waiting {age(now - timedelta(seconds=oldest), now)}"
            if oldest
            else ""
        )
    )
    say(
        f"absorbed   {data['enqueue_duplicates']} duplicate enqueue(s) held off by their key, "
        f"{data['claim_conflicts']} duplicate job(s) at the claim (counted since schema 8)"
    )
    say(
        "outbox     "
        + ", ".join(f"{state} {outbox[state]}" for state in OUTBOX_STATES)
        + (
            f"; oldest pending {age(now - timedelta(seconds=pending_age), now)}"
            if pending_age is not None
            else ""
        )
    )
    backlog = [shapes.backlog_row(entry) for entry in data["backlog"]]
    unserved = [entry["task"] for entry in data["unserved_tasks"]]
    if backlog:
        say(f"waiting    ({data['workers_live']} live worker(s))")
        for line in backlog_lines(backlog, unserved, now):
            say(f"  {line}")
    if data["fan_outs"]:
        say(f"fan-outs   ({len(data['fan_outs'])} running)")
        for entry in data["fan_outs"]:
            say(f"  {fan_out_line(entry, now)}")
    attention = attention_items(data, now)
    say("attention  " + ("; ".join(attention) if attention else "none"))
    for channel, figures in data["reports"].items():
        say(report_line(channel, figures))
    if data["limits"]:
        say("\nlimits (jobs held back by a task's limits; the longest-waiting partitions first)")
        print_table(LIMIT_HEADERS, limits_table(data["limits"], now), "")
    retention = retention_table(data["retention"], now)
    if retention:
        policy = "" if app else " (the default policy: pass --app for your Box's)"
        say(f"\nretention{policy}")
        print_table(HEADERS, retention, "")
    for entry in data["schedules"]:
        say(f"\nschedule {entry['name']}" + ("  (paused)" if entry["paused"] else ""))
        print_table(
            PERIOD_HEADERS,
            [
                [
                    p["period"],
                    p["state"],
                    p["eligible"],
                    p["enqueued"],
                    p["sent"],
                    p["pending"],
                    p["dead"],
                    p["ambiguous"],
                    "-" if p["coverage"] is None else f"{100 * p['coverage']:.1f}%",
                ]
                for p in entry["periods"]
            ],
            "  no fan-out yet",
        )
        if entry["slo"] is not None:
            judged = [p for p in entry["periods"] if p["slo"] is not None]
            say(slo_line(entry["slo"], judged[:1]))  # the latest period that fired


def quiet_line(entry: dict[str, Any], now: datetime) -> str:
    """Jobs held by limits no process declares lately, and when they go free."""
    declared = datetime.fromisoformat(entry["last_declared_at"])
    freed = datetime.fromisoformat(entry["freed_at"])
    when = f"in {age(now, freed)}" if freed > now else "at the next rescuer pass"
    return (
        f"{entry['waiting']}{'+' if entry['waiting_capped'] else ''} job(s) of task "
        f"{entry['task']} wait on limits ({entry['declared']}) no process has declared for "
        f"{age(declared, now)}: a worker that runs {entry['task']} without limits frees them "
        f"{when} (one that limits it runs them meanwhile)"
    )


def attention_items(data: dict[str, Any], now: datetime) -> list[str]:
    """What needs a person, from `status --json`'s data, with the command to look at it."""
    attention = [
        f"{entry['waiting']} job(s) of task {entry['task']} wait with no live worker serving it"
        for entry in data["unserved_tasks"]
    ]
    attention += [quiet_line(entry, now) for entry in data["quiet_limits"]]
    gone = [entry for entry in data["fan_outs"] if not entry["owner_live"]]
    if gone:
        attention.append(f"{len(gone)} fan-out(s) whose owner is gone (fan-outs, above)")
    if data["dead"]:
        attention.append(f"{data['dead']} dead (oncebox dlq list)")
    if data["ambiguous"]:
        attention.append(f"{data['ambiguous']} ambiguous (oncebox outbox list --state ambiguous)")
    return attention


def report_line(channel: str, figures: dict[str, Any]) -> str:
    """What a channel's provider reported, and its bounce and complaint rates."""

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f} %"

    stages = ", ".join(
        f"{stage} {figures[stage]}"
        for stage in ("delivered", "delayed", "failed", "bounced", "complained")
        if figures[stage]
    )
    return (
        f"reports    {channel}: {figures['reported']} message(s) reported on"
        + (f" ({stages})" if stages else "")
        + f"; bounce rate {rate(figures['bounce_rate'])}, "
        f"complaint rate {rate(figures['complaint_rate'])}"
    )


def hours(seconds: float) -> str:
    """4h, 1h30m, 90s: a delivery window as it was declared."""
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    text = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s else "")
    return text or "0s"


def slo_line(slo: dict[str, Any], latest: list[dict[str, Any]]) -> str:
    """The schedule's promise, and how its latest period keeps it."""
    window, target = hours(slo["deliver_within_s"]), 100 * slo["target"]
    head = f"slo        deliver within {window} to {target:g} %"
    judged = latest[0]["slo"] if latest else None
    if judged is None:
        return head + ": no fired period to judge yet"
    text = (
        f"{head}: {latest[0]['period']} {judged['on_time']} of {latest[0]['eligible']} on time, "
        f"{judged['misses']} missed of {judged['allowed_misses']} allowed"
    )
    if judged["closed"]:
        return text + ("; window closed, promise BROKEN" if judged["budget_left"] < 0 else "; kept")
    text += f"; {judged['projected_misses']} projected to miss by {judged['window_ends_at']}"
    return text + ("  AT RISK" if judged["at_risk"] else "")


@click.group()
def jobs() -> None:
    """Inspect jobs, and cancel one."""


@jobs.command("list")
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--task")
@click.option("--queue")
@click.option("--schedule", help="Jobs enqueued by this schedule's fan-outs.")
@click.option("--period", help="With --schedule: of this period.")
@before_option
@limit_option()
@app_option
@db_option
@json_option
def jobs_list(
    *,
    state: str | None,
    task: str | None,
    queue: str | None,
    schedule: str | None,
    period: str | None,
    before_id: int | None,
    limit: int,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Jobs, newest first."""
    with reported():
        box = box_for_admin(app, db)
        rows = box.store.job_list(
            JobFilter(
                state=state,  # type: ignore[arg-type]
                task=task,
                queue=queue,
                schedule=schedule,
                period=period,
                before_id=before_id,
                limit=limit,
            )
        )
    if as_json:
        print_json([shapes.job(row) for row in rows])
        return
    print_table(
        ["ID", "TASK", "KEY", "STATE", "ATTEMPT", "RUN AT", "LAST ERROR"],
        [
            [
                r.id,
                r.task,
                r.key,
                r.state if r.outcome is None else f"{r.state} ({r.outcome})",
                f"{r.attempt}/{r.max_attempts}",
                shapes.instant(r.run_at),
                r.last_error,
            ]
            for r in rows
        ],
        "no jobs",
    )


@jobs.command("show")
@click.argument("key_or_id")
@app_option
@db_option
@json_option
def jobs_show(key_or_id: str, app: str | None, db: str | None, as_json: bool) -> None:
    """A job (by id) or a key's jobs, with every recorded attempt."""
    with reported():
        box = box_for_admin(app, db)
        found = box.find(id_or_key(key_or_id, "job"))
        if not found:
            raise NotFound(f"no job with id or key {key_or_id!r}")
        records = [shapes.job(job, box.store.job_attempt_list(job.id)) for job in found]
    if as_json:
        print_json(records)
        return
    for record in records:
        state = record["state"] + (f" ({record['outcome']})" if record["outcome"] else "")
        say(
            f"job {record['id']}  {record['task']}  key={record['key']}  state={state}  "
            f"attempt={record['attempt']}/{record['max_attempts']}"
        )
        say(f"  args {json.dumps(record['args'], ensure_ascii=False)}")
        if record["schedule"]:
            say(f"  enqueued by schedule {record['schedule']} for {record['period']}")
        for attempt in record["attempts"]:
            first = (attempt["error"] or "").splitlines()[:1]
            say(
                f"  attempt {attempt['attempt']}: {attempt['outcome']} by "
                f"{attempt['worker']} at {attempt['finished_at']}: {' '.join(first)}"
            )


@jobs.command("cancel")
@click.argument("key_or_id")
@reason_option
@actor_option
@app_option
@db_option
@json_option
def jobs_cancel(
    *, key_or_id: str, reason: str, actor: str, app: str | None, db: str | None, as_json: bool
) -> None:
    """Cancel a ready job — a queued job or a pending timer — audited. A running job is not
    cancelled (it may be committing); a cancelled key can be enqueued again."""
    with reported():
        box = box_for_admin(app, db)
        outcome = box.cancel(id_or_key(key_or_id, "job"), reason=reason, actor=actor)
    if as_json:
        print_json({"id": outcome.id, "key": outcome.key, "audit_id": outcome.audit_id})
    else:
        say(f"job {outcome.id} ({outcome.key}) cancelled; audit #{outcome.audit_id}")


@click.group()
def audit() -> None:
    """The audit log: every operator action, with who and why, and every refused console
    login, with its address."""


@audit.command("list")
@click.option("--key", help="Actions on this key.")
@click.option(
    "--action",
    type=click.Choice(
        [
            "replay",
            "cancel",
            "resolve-sent",
            "resolve-resend",
            "discard",
            "report-duplicate",
            "pause",
            "resume",
            "accept-keys",
            "clock-reset",
            "login-refused",
        ]
    ),
    help="Only entries of this action.",
)
@before_option
@limit_option()
@app_option
@db_option
@json_option
def audit_list(
    *,
    key: str | None,
    action: str | None,
    before_id: int | None,
    limit: int,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Audit entries, newest first."""
    with reported():
        if key is not None:
            validate_key(key.replace("~", "-"))
        box = box_for_admin(app, db)
        rows = box.store.audit_search(
            AuditFilter(action=action, key=key, before_id=before_id, limit=limit)
        )
    if as_json:
        print_json([shapes.audit(row) for row in rows])
        return
    print_table(
        ["ID", "AT", "ACTOR", "ACTION", "TARGET", "KEY", "REASON"],
        [
            [
                r.id,
                shapes.instant(r.at),
                r.actor,
                r.action,
                f"{r.target_kind} {r.target_id}" if r.target_id is not None else r.target_kind,
                r.target_key,
                r.reason,
            ]
            for r in rows
        ],
        "no audit entries",
    )
