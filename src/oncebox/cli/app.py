"""The `oncebox` command group: every command registered in one place (`--help` lists them
alphabetically)."""

from __future__ import annotations

import logging
import os
from typing import Any

import click

from oncebox.cli.api_key_cmds import api_keys
from oncebox.cli.chaos_cmd import chaos
from oncebox.cli.clock_cmds import clock
from oncebox.cli.common import InertFormatter, fail
from oncebox.cli.console_cmd import console
from oncebox.cli.demo_cmd import demo
from oncebox.cli.dlq_cmds import dlq
from oncebox.cli.inspect_cmds import audit, jobs, status
from oncebox.cli.keys_cmds import keys
from oncebox.cli.metrics_cmd import metrics
from oncebox.cli.outbox_cmds import outbox, report_duplicate
from oncebox.cli.plan_cmd import plan_command
from oncebox.cli.prune_cmd import prune_command
from oncebox.cli.run_cmds import enqueue, migrate, worker
from oncebox.cli.schedule_cmds import schedule
from oncebox.cli.serve_cmd import receive, serve
from oncebox.cli.sim_cmd import sim
from oncebox.kernel.inert import printable
from oncebox.kernel.logs import JsonLines


class _Oncebox(click.Group):
    """The group, refusing text it could not write anywhere before any command sees it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        refuse_undecodable(args, os.environ)
        return super().parse_args(ctx, args)


def refuse_undecodable(args: list[str], environ: Any) -> None:
    """Bytes that are not UTF-8, in an argument or an ONCEBOX_* variable, reach Python as lone
    surrogates that no database, log or audit entry can hold: a usage mistake, named with the
    option it was given to, before it fails half-way through a command."""
    for index, arg in enumerate(args):
        if not _undecodable(arg):
            continue
        option, equals, value = arg.partition("=")
        previous = args[index - 1] if index else ""
        if arg.startswith("--") and equals:
            fail(f"{option} is not UTF-8 text: '{printable(value)}'", 2)
        where = previous if previous.startswith("-") else f"argument {index + 1}"
        fail(f"{where} is not UTF-8 text: '{printable(arg)}'", 2)
    for name in sorted(environ):
        if name.startswith("ONCEBOX_") and _undecodable(environ[name]):
            fail(f"{name} is not UTF-8 text: '{printable(environ[name])}'", 2)


def _undecodable(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


@click.group(cls=_Oncebox, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="ONCEBOX_LOG_FORMAT",
    show_default=True,
    help="The log's shape: lines for people, or JSON lines (a job's key, job id, attempt, "
    "worker and trace id as fields) for a log pipeline [env ONCEBOX_LOG_FORMAT].",
)
def main(verbose: int, log_format: str) -> None:
    """oncebox: background jobs whose side effects happen once per business operation.

    Commands read ONCEBOX_DB, ONCEBOX_APP and ONCEBOX_EMAIL. Exit 2 on a usage mistake, 1 on a
    runtime failure (or a failed check); one line on stderr, and a traceback only with -v."""
    level = logging.WARNING - 10 * min(verbose, 2)
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonLines()
        if log_format == "json"
        else InertFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level, handlers=[handler])


for command in (
    chaos,
    sim,
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
    console,
    serve,
    receive,
    api_keys,
    metrics,
    report_duplicate,
    plan_command,
    prune_command,
):
    main.add_command(command)
