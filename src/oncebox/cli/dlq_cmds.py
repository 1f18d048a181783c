"""`oncebox dlq list|show|replay`: dead letters — dead jobs and dead outbox rows — and the way
back, in place, under the same key."""

from __future__ import annotations

from typing import Literal

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
    reason_option,
    reported,
    say,
)
from oncebox.errors import InvalidState, NotFound
from oncebox.operations import ActionOutcome, DeadFilter
from oncebox.store.base import JobRow

KIND = click.Choice(["job", "delivery"])


@click.group()
def dlq() -> None:
    """Dead letters: jobs and messages that failed for good, kept with their key and every
    attempt."""


@dlq.command("list")
@click.option("--kind", type=KIND, help="Only dead jobs, or only dead deliveries.")
@click.option("--task", help="Dead jobs of this task.")
@click.option("--channel", help="Dead deliveries on this channel.")
@limit_option()
@app_option
@db_option
@json_option
def dlq_list(
    *,
    kind: Literal["job", "delivery"] | None,
    task: str | None,
    channel: str | None,
    limit: int,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Dead jobs and dead deliveries, newest first."""
    with reported():
        box = box_for_admin(app, db)
        rows = box.dead_letters(DeadFilter(kind=kind, task=task, channel=channel, limit=limit))
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


@dlq.command("replay")
@click.argument("key_or_id", required=False)
@click.option("--all", "replay_all", is_flag=True, help="Every dead letter the filters match.")
@click.option("--kind", type=KIND, help="Jobs or deliveries (with an id: which one it is).")
@click.option("--task", help="With --all: dead jobs of this task.")
@click.option("--channel", help="With --all: dead deliveries on this channel.")
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
@reason_option
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
    limit: int,
    rate: float,
    reason: str,
    actor: str,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Replay a dead job or delivery in place — same id, same key, history kept, audited — or,
    with --all, every one the filters match at --rate a second. A replayed job whose key was
    claimed meanwhile completes as a duplicate; nothing is replayed under a new key."""
    if replay_all == (key_or_id is not None):
        fail("give KEY_OR_ID or --all (with filters), not both and not neither", 2)
    if not replay_all and (task or channel):
        fail("--task and --channel filter --all; a single replay names its key or id", 2)
    outcomes: list[ActionOutcome] = []
    with reported():
        box = box_for_admin(app, db)
        if key_or_id is not None:
            target = id_or_key(key_or_id, "job or outbox row")
            outcomes.append(box.replay(target, reason=reason, actor=actor, kind=kind))
            if not as_json:
                _echo_outcome(outcomes[0])
        else:
            outcomes = box.replay_dead(
                DeadFilter(kind=kind, task=task, channel=channel, limit=limit),
                reason=reason,
                actor=actor,
                per_second=rate,
                on_each=(lambda _o: None) if as_json else _echo_outcome,
            )
            if not as_json:
                say(f"{len(outcomes)} replayed")
    if as_json:
        print_json(
            [{"kind": o.kind, "id": o.id, "key": o.key, "audit_id": o.audit_id} for o in outcomes]
        )
