"""The `oncebox` command group: every command registered in one place (`--help` lists them
alphabetically)."""

from __future__ import annotations

import logging

import click

from oncebox.cli.chaos_cmd import chaos
from oncebox.cli.clock_cmds import clock
from oncebox.cli.demo_cmd import demo
from oncebox.cli.dlq_cmds import dlq
from oncebox.cli.inspect_cmds import audit, jobs, status
from oncebox.cli.keys_cmds import keys
from oncebox.cli.outbox_cmds import outbox
from oncebox.cli.run_cmds import enqueue, migrate, worker
from oncebox.cli.schedule_cmds import schedule


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """oncebox: background jobs whose side effects happen once per business operation.

    Commands read ONCEBOX_DB, ONCEBOX_APP and ONCEBOX_EMAIL. Exit 2 on a usage mistake, 1 on a
    runtime failure (or a failed check); one line on stderr, and a traceback only with -v."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for command in (
    chaos,
    demo,
    migrate,
    worker,
    enqueue,
    status,
    schedule,
    jobs,
    dlq,
    outbox,
    audit,
    keys,
    clock,
):
    main.add_command(command)
