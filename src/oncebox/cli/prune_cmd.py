"""`oncebox prune [--dry-run]`: retention now, at an hour the operator chose — or what it would
take — and the retention table `status` prints."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click

from oncebox import shapes
from oncebox.cli.common import (
    age,
    app_option,
    db_option,
    json_option,
    load_app,
    print_json,
    print_table,
    reported,
    say,
)
from oncebox.lanes.assembly import build_pruner
from oncebox.lanes.pruner import PrunerConfig, plan_for
from oncebox.lanes.worker import refuse_foreign_clock
from oncebox.retention.held import KIND_LABELS, held, kept
from oncebox.store.migrations import check_runnable
from oncebox.store.params import PRUNE_KINDS

HEADERS = ["ROWS", "KEPT", "OLDEST KEPT", "PAST RETENTION"]


def retention_table(entries: Sequence[dict[str, Any]], now: datetime) -> list[list[str]]:
    """One row per kind, its names folded: the policies in force (a range when tasks or channels
    differ), the oldest row kept, and how many rows are past retention."""
    rows = []
    for kind in PRUNE_KINDS:
        mine = [e for e in entries if e["kind"] == kind]
        if not mine:
            continue
        policies = sorted({kept(e["keep_s"]) for e in mine})
        oldest = min((e["oldest"] for e in mine if e["oldest"]), default=None)
        waiting = sum(e["waiting"] for e in mine)
        capped = "+" if any(e["waiting_capped"] for e in mine) else ""
        rows.append(
            [
                KIND_LABELS[kind],
                ", ".join(policies),
                "-" if oldest is None else f"{age(datetime.fromisoformat(oldest), now)} ago",
                f"{waiting}{capped}",
            ]
        )
    return rows


@click.command("prune")
@click.option(
    "--dry-run", is_flag=True, help="Say what would be pruned now, per kind of row; change nothing."
)
@click.option(
    "--simulated-time",
    is_flag=True,
    help="Prune on a frozen or offset database clock that another process holds (a test "
    "harness); without it such a clock is refused.",
)
@app_option
@db_option
@json_option
def prune_command(
    dry_run: bool, simulated_time: bool, app: str | None, db: str | None, as_json: bool
) -> None:
    """Apply retention now: everything past its retention, in batches, until none is left (the
    pruner in every worker does the same, paced, every 10 min). Needs --app: the policies are
    your Box's Retention and its tasks' and channels' keep_* settings."""
    with reported():
        box = load_app(app, db)
        check_runnable(box.store.schema_status(), box.where)
        if not simulated_time:
            refuse_foreign_clock(box.runtime)
        plan = plan_for(box.runtime)
        now = box.store.clock_now()
        if dry_run:
            entries = [shapes.held(row, now) for row in held(box.store, plan, cap=None)]
        else:
            result = build_pruner(box.runtime, PrunerConfig(), plan).drain()
            pruned = result.pruned  # in PRUNE_KINDS order
    if dry_run:
        if as_json:
            print_json({"now": shapes.instant(now), "retention": entries})
            return
        say(
            f"would prune now (nothing is changed), by the database's clock ({now:%Y-%m-%d %H:%M}):"
        )
        print_table(HEADERS, retention_table(entries, now), "  nothing kept that retention governs")
        return
    if as_json:
        print_json({"now": shapes.instant(now), "pruned": pruned})
        return
    say(
        "pruned "
        + ", ".join(f"{count} {KIND_LABELS[kind]}" for kind, count in pruned.items())
        + (" (payloads dropped: rows kept)" if pruned["payloads"] else "")
    )
