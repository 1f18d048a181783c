"""`oncebox keys check|accept`: the key-drift guard, for deploy pipelines and operators."""

from __future__ import annotations

import sys

import click

from oncebox.cli.common import (
    actor_option,
    app_option,
    db_option,
    json_option,
    load_app,
    print_json,
    print_table,
    reason_option,
    reported,
    say,
)


@click.group()
def keys() -> None:
    """The key-drift guard: tasks and schedules whose keys would change."""


@keys.command("check")
@app_option
@db_option
@json_option
def keys_check(app: str | None, db: str | None, as_json: bool) -> None:
    """Compare this code's key templates and period functions with what the store recorded.
    Writes nothing. Exit 1 when something drifted, or when jobs wait for a task this code lacks
    (a rename): run it before a deploy."""
    with reported():
        box = load_app(app, db)
        statuses = box.key_guard.check()
    if as_json:
        print_json(
            [
                {
                    "kind": s.kind,
                    "name": s.name,
                    "status": s.status,
                    "source": s.source,
                    "detail": s.detail or None,
                }
                for s in statuses
            ]
        )
    else:
        print_table(
            ["KIND", "NAME", "STATUS", "SOURCE"],
            [[s.kind, s.name, s.status, s.source] for s in statuses],
            "no task with a key template and no schedule",
        )
        for s in statuses:
            if s.detail:
                say(f"\n{s.detail}")
    sys.exit(1 if any(s.status in ("drifted", "orphaned") for s in statuses) else 0)


@keys.command("accept")
@click.argument("name")
@reason_option
@actor_option
@app_option
@db_option
@json_option
def keys_accept(
    *, name: str, reason: str, actor: str, app: str | None, db: str | None, as_json: bool
) -> None:
    """Accept this code's keys for NAME (a task or schedule; `task:NAME` or `schedule:NAME`
    when both exist). Every process picks it up within a minute; processes still running the
    previous code then refuse instead. Audited."""
    with reported():
        box = load_app(app, db)
        audit_id = box.key_guard.accept(name, actor=actor, reason=reason)
    if as_json:
        print_json({"name": name, "accepted": audit_id is not None, "audit_id": audit_id})
    elif audit_id is None:
        say(f"{name}: the recorded keys already match this code; nothing to accept")
    else:
        say(f"{name}: this code's keys are accepted; audit #{audit_id}")
