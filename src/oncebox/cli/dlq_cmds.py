"""`oncebox dlq list|show|replay|discard`: dead letters — dead jobs and dead outbox rows — the
way back, in place, under the same key, and the way out for an operation abandoned. In bulk, a
dry run (`--dry-run`) shows what would be done and writes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click

from oncebox import shapes
from oncebox.cli.common import (
    actor_option,
    app_option,
    box_for_admin,
    db_option,
    fail,
    id_or_key,
    is_id,
    json_option,
    limit_option,
    print_json,
    print_table,
    reported,
    say,
)
from oncebox.cli.outbox_cmds import discard_next_step
from oncebox.jobs.dead_letters import DeadLetter, DiscardPlan, ReplayPlan, Skipped
from oncebox.kernel.durations import parse_duration
from oncebox.kernel.errors import InvalidState, NotFound
from oncebox.runtime.operations import ActionOutcome, DeadFilter
from oncebox.store.records import JobRow

KIND = click.Choice(["job", "delivery"])
F = TypeVar("F", bound=Callable[..., Any])


def filter_options(func: F) -> F:
    """The dead-letter filters beyond kind, task and channel, as `dlq list` and the `--all`
    forms of `replay` and `discard` take them."""
    options = [
        click.option("--error", metavar="TEXT", help="Last error contains TEXT (any case)."),
        click.option(
            "--period",
            metavar="PERIOD",
            help="Of this schedule period, e.g. 2026-W33 (a delivery: its job's).",
        ),
        click.option(
            "--older-than",
            metavar="DURATION",
            help="Died at least this long ago: 30m, 2h, 1d, 1h30m.",
        ),
        click.option("--newer-than", metavar="DURATION", help="Died less than this long ago."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def dead_filter(
    kind: Literal["job", "delivery"] | None,
    task: str | None,
    channel: str | None,
    limit: int,
    filters: dict[str, str | None],
) -> DeadFilter:
    """The filter the options name; a bad duration or an impossible combination raises
    `ConfigurationError` (exit 2, one line)."""
    older, newer = filters["older_than"], filters["newer_than"]
    return DeadFilter(
        kind=kind,
        task=task,
        channel=channel,
        limit=limit,
        error=filters["error"],
        period=filters["period"],
        older_than=None if older is None else parse_duration(older, "--older-than"),
        newer_than=None if newer is None else parse_duration(newer, "--newer-than"),
    )


def _filters(**options: str | None) -> dict[str, str | None]:
    return options


def _given(filters: dict[str, str | None]) -> list[str]:
    return ["--" + name.replace("_", "-") for name, value in filters.items() if value is not None]


@click.group()
def dlq() -> None:
    """Dead letters: jobs and messages that failed for good, kept with their key and every
    attempt."""


@dlq.command("list")
@click.option("--kind", type=KIND, help="Only dead jobs, or only dead deliveries.")
@click.option("--task", help="Dead jobs of this task.")
@click.option("--channel", help="Dead deliveries on this channel.")
@filter_options
@limit_option()
@app_option
@db_option
@json_option
def dlq_list(
    *,
    kind: Literal["job", "delivery"] | None,
    task: str | None,
    channel: str | None,
    error: str | None,
    period: str | None,
    older_than: str | None,
    newer_than: str | None,
    limit: int,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Dead jobs and dead deliveries, newest first."""
    filters = _filters(error=error, period=period, older_than=older_than, newer_than=newer_than)
    with reported():
        where = dead_filter(kind, task, channel, limit, filters)
        box = box_for_admin(app, db)
        rows = box.dead_letters(where)
    if as_json:
        print_json(
            [
                {"kind": "job", **shapes.job(r)}
                if isinstance(r, JobRow)
                else {"kind": "delivery", **shapes.message(r)}
                for r in rows
            ]
        )
        return
    print_table(
        ["KIND", "ID", "KEY", "TASK/CHANNEL", "ATTEMPTS", "LAST ERROR"],
        [
            ["job", r.id, r.key, r.task, r.attempt, r.last_error]
            if isinstance(r, JobRow)
            else ["delivery", r.id, r.key, r.channel, r.attempt, r.last_error]
            for r in rows
        ],
        "no dead letters",
    )


@dlq.command("show")
@click.argument("key_or_id")
@click.option(
    "--kind", type=KIND, help="Look only at dead jobs or only at dead messages (default: both)."
)
@app_option
@db_option
@json_option
def dlq_show(
    *,
    key_or_id: str,
    kind: Literal["job", "delivery"] | None,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """A dead letter with every attempt and its last error."""
    with reported():
        box = box_for_admin(app, db)
        by_id = is_id(id_or_key(key_or_id, "dead job or delivery"))
        records = []
        if kind != "delivery":
            records += [
                {"kind": "job", **shapes.job(j, box.store.job_attempt_list(j.id))}
                for j in box.find(key_or_id)
                if j.state == "dead"
            ]
        if kind != "job":
            if by_id:
                found = box.store.outbox_get(int(key_or_id))
                rows = [found] if found is not None else []
            else:
                rows = box.store.outbox_find_by_key(key_or_id)
            records += [
                {"kind": "delivery", **shapes.message(r, box.store.delivery_attempt_list(r.id))}
                for r in rows
                if r.state == "dead"
            ]
        if not records:
            raise NotFound(f"no dead job or delivery with id or key {key_or_id!r}")
    if as_json:
        print_json(records)
        return
    for record in records:
        target = record["task"] if record["kind"] == "job" else record["channel"]
        say(f"dead {record['kind']} {record['id']}  {target}  key={record['key']}")
        for attempt in record["attempts"]:
            first = (attempt["error"] or "").splitlines()[:1]
            say(
                f"  attempt {attempt['attempt']}: {attempt['outcome']} at "
                f"{attempt['finished_at']}: {' '.join(first)}"
            )
        say("  last error:")
        for line in (record["last_error"] or "-").splitlines():
            say(f"    {line}")


def _echo_outcome(outcome: ActionOutcome | InvalidState) -> None:
    if isinstance(outcome, InvalidState):
        say(f"skipped: {outcome}")
    elif outcome.kind == "delivery":
        say(f"message {outcome.id} ({outcome.key}) is pending again; audit #{outcome.audit_id}")
    else:
        say(f"job {outcome.id} ({outcome.key}) is ready again; audit #{outcome.audit_id}")


def _print_plan(planned: ReplayPlan | DiscardPlan, verb: str) -> None:
    """A dry run as text: one line per row it would act on (the key whole), the rows a discard
    would refuse and why, and the count."""
    print_table(
        ["KIND", "ID", "KEY", "TASK/CHANNEL", "LAST ERROR"],
        [_letter_row(row) for row in planned.rows],
        "no dead letters match",
        uncut=("KEY",),
    )
    if isinstance(planned, DiscardPlan):
        for refused in planned.refused:
            say(f"refused: {refused.why}")
    if planned.more:
        limit = planned.where.limit
        say(f"more dead letters match than --limit {limit}: only the first {limit} are listed")
    say(f"{planned.count} would be {verb}; nothing was changed")


def _letter_row(row: DeadLetter) -> list[object]:
    return [row.kind, row.id, row.key, row.task or row.channel, row.last_error]


def _reason(reason: str | None, dry_run: bool) -> str:
    """--reason is required for an action that is written; a dry run writes nothing."""
    if reason is None and not dry_run:
        fail("Missing option '--reason': why, written to the audit log (not with --dry-run)", 2)
    return reason or ""


def _check_batch(
    verb: str,
    key_or_id: str | None,
    every: bool,
    *,
    dry_run: bool,
    task: str | None,
    channel: str | None,
    filters: dict[str, str | None],
) -> None:
    """The forms of `replay` and `discard`: one row by KEY_OR_ID, or --all with filters."""
    if every == (key_or_id is not None):
        fail("give KEY_OR_ID or --all (with filters), not both and not neither", 2)
    if every:
        return
    named = ["--task"] * bool(task) + ["--channel"] * bool(channel) + _given(filters)
    if named:
        fail(f"{', '.join(named)}: these filter --all; a single {verb} names its key or id", 2)
    if dry_run:
        fail(f"--dry-run previews --all; a single {verb} names its key or id (see dlq show)", 2)


REASON = click.option(
    "--reason",
    help="Why; written to the audit log. Required, except with --dry-run.",
)
DRY_RUN = click.option(
    "--dry-run",
    is_flag=True,
    help="With --all: list what would be done, and write nothing.",
)


@dlq.command("replay")
@click.argument("key_or_id", required=False)
@click.option("--all", "replay_all", is_flag=True, help="Every dead letter the filters match.")
@click.option("--kind", type=KIND, help="Jobs or deliveries (with an id: which one it is).")
@click.option("--task", help="With --all: dead jobs of this task.")
@click.option("--channel", help="With --all: dead deliveries on this channel.")
@filter_options
@click.option(
    "--limit",
    type=click.IntRange(1, 1_000_000),
    default=1000,
    show_default=True,
    help="With --all: at most this many.",
)
@click.option(
    "--rate",
    type=click.FloatRange(0.1, 10_000),
    default=20.0,
    show_default=True,
    help="With --all: replays per second.",
)
@DRY_RUN
@REASON
@actor_option
@app_option
@db_option
@json_option
def dlq_replay(
    *,
    key_or_id: str | None,
    replay_all: bool,
    kind: Literal["job", "delivery"] | None,
    task: str | None,
    channel: str | None,
    error: str | None,
    period: str | None,
    older_than: str | None,
    newer_than: str | None,
    limit: int,
    rate: float,
    dry_run: bool,
    reason: str | None,
    actor: str,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Replay a dead job or delivery in place — same id, same key, history kept, audited — or,
    with --all, every one the filters match at --rate a second. A replayed job whose key was
    claimed meanwhile completes as a duplicate; nothing is replayed under a new key. Run
    --all with --dry-run first: it lists what would move and writes nothing."""
    filters = _filters(error=error, period=period, older_than=older_than, newer_than=newer_than)
    _check_batch(
        "replay",
        key_or_id,
        replay_all,
        dry_run=dry_run,
        task=task,
        channel=channel,
        filters=filters,
    )
    why = _reason(reason, dry_run)
    outcomes: list[ActionOutcome] = []
    planned: ReplayPlan | None = None
    with reported():
        where = dead_filter(kind, task, channel, limit, filters) if replay_all else None
        box = box_for_admin(app, db)
        if where is None:
            target = id_or_key(key_or_id or "", "job or outbox row")
            outcomes.append(box.replay(target, reason=why, actor=actor, kind=kind))
            if not as_json:
                _echo_outcome(outcomes[0])
        elif dry_run:
            planned = box.plan_replay(where)
        else:
            outcomes = box.replay_dead(
                where,
                reason=why,
                actor=actor,
                per_second=rate,
                on_each=(lambda _o: None) if as_json else _echo_outcome,
            )
            if not as_json:
                say(f"{len(outcomes)} replayed")
    if planned is not None:
        if as_json:
            print_json(shapes.plan(planned))
        else:
            _print_plan(planned, "replayed")
    elif as_json:
        print_json(
            [{"kind": o.kind, "id": o.id, "key": o.key, "audit_id": o.audit_id} for o in outcomes]
        )


def _echo_discarded(item: ActionOutcome | Skipped) -> None:
    if isinstance(item, Skipped):
        say(f"skipped: {item.why}")
    elif item.discard is not None:
        done = item.discard
        say(
            f"message {done.id} ({done.key}) discarded; kept as {done.renamed}; "
            f"audit #{done.audit_id}"
        )
        say(discard_next_step(done))
    else:
        say(
            f"job {item.id} ({item.key}) discarded: cancelled, its attempts kept, its key free; "
            f"audit #{item.audit_id}"
        )


@dlq.command("discard")
@click.argument("key_or_id", required=False)
@click.option("--all", "discard_all", is_flag=True, help="Every dead letter the filters match.")
@click.option("--kind", type=KIND, help="Jobs or deliveries (with an id: which one it is).")
@click.option("--task", help="With --all: dead jobs of this task.")
@click.option("--channel", help="With --all: dead deliveries on this channel.")
@filter_options
@click.option(
    "--limit",
    type=click.IntRange(1, 1_000_000),
    default=1000,
    show_default=True,
    help="With --all: at most this many.",
)
@DRY_RUN
@REASON
@actor_option
@app_option
@db_option
@json_option
def dlq_discard(
    *,
    key_or_id: str | None,
    discard_all: bool,
    kind: Literal["job", "delivery"] | None,
    task: str | None,
    channel: str | None,
    error: str | None,
    period: str | None,
    older_than: str | None,
    newer_than: str | None,
    limit: int,
    dry_run: bool,
    reason: str | None,
    actor: str,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Give up on a dead letter, audited: a dead job whose operation is abandoned becomes
    cancelled (its attempts kept, its key free for a new enqueue); a dead message no provider
    will take is discarded as by `outbox discard`. With --all, every one the filters match —
    never a message that may have been delivered. Run --all with --dry-run first."""
    filters = _filters(error=error, period=period, older_than=older_than, newer_than=newer_than)
    _check_batch(
        "discard",
        key_or_id,
        discard_all,
        dry_run=dry_run,
        task=task,
        channel=channel,
        filters=filters,
    )
    why = _reason(reason, dry_run)
    outcomes: list[ActionOutcome] = []
    planned: DiscardPlan | None = None
    with reported():
        where = dead_filter(kind, task, channel, limit, filters) if discard_all else None
        box = box_for_admin(app, db)
        if where is None:
            target = id_or_key(key_or_id or "", "job or outbox row")
            outcomes.append(box.discard_dead(target, reason=why, actor=actor, kind=kind))
            if not as_json:
                _echo_discarded(outcomes[0])
        else:
            planned = box.plan_discard(where)
            if not dry_run:
                if not as_json:
                    for refused in planned.refused:
                        say(f"refused: {refused.why}")
                done = box.discard_planned(
                    planned,
                    reason=why,
                    actor=actor,
                    on_each=(lambda _o: None) if as_json else _echo_discarded,
                )
                outcomes = list(done.done)
                if not as_json:
                    say(f"{len(outcomes)} discarded")
    if planned is not None and dry_run:
        if as_json:
            print_json(shapes.plan(planned))
        else:
            _print_plan(planned, "discarded")
    elif as_json:
        print_json([shapes.discarded(o) for o in outcomes])
