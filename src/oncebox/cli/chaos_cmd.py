"""`oncebox chaos`: the failure-injection harness (see oncebox.chaos)."""

from __future__ import annotations

import logging
import os
import sys

import click

from oncebox.cli.common import reported


def _scenario_names() -> list[str]:
    from oncebox.chaos.scenarios import SCENARIOS  # noqa: PLC0415 (keeps start-up light)

    return ["ci", "all", *SCENARIOS]


class _Chaos(click.Command):
    """`oncebox chaos`, whose help ends with every scenario's name, whole (not broken at a
    hyphen) so that it can be copied: the harness is imported to list them only when the help
    is shown, so the command line still starts without it."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        names = _scenario_names()[2:]
        with formatter.section(f"Scenarios ({len(names)}, for --scenario)"):
            width = max(formatter.width - formatter.current_indent, 40)
            line = ""
            for name in names:
                if line and len(line) + 2 + len(name) > width:
                    formatter.write(f"{'':{formatter.current_indent}}{line}\n")
                    line = ""
                line = f"{line}  {name}" if line else name
            formatter.write(f"{'':{formatter.current_indent}}{line}\n")


@click.command(cls=_Chaos)
@click.option(
    "--db",
    metavar="URL",
    help="A PostgreSQL server to run on (postgresql://host/db): each scenario creates a database "
    "of its own there and drops it after; the one named is never touched. Default: a temporary "
    "SQLite file. Not read from ONCEBOX_DB.",
)
@click.option(
    "--scenario",
    "name",
    default="ci",
    show_default=True,
    metavar="NAME|ci|all",
    help="One scenario (listed below), the CI set (no server restart, no soak), or all.",
)
@click.option(
    "--customers",
    type=click.IntRange(20, 100_000),
    default=200,
    show_default=True,
    help="Freight customers in the workload.",
)
@click.option("--seed", type=click.IntRange(0, 2**31), default=1, show_default=True)
@click.option("--soak", is_flag=True, help="Add the soak: random SIGKILLs for a whole run.")
@click.option(
    "--allow-server-restart",
    is_flag=True,
    help="Allow the scenarios that restart a server (PostgreSQL, RabbitMQ, NATS): always a "
    "private one the harness starts for the run on free ports, never the --db server or the "
    "machine's brokers.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option(
    "--mutation",
    "mutations",
    multiple=True,
    metavar="NAME",
    help="Break a guarantee on purpose (docs/guarantees.md lists them, with the scenario each "
    "must make fail) to see the harness fail: for the harness's own tests.",
)
def chaos(
    *,
    db: str | None,
    name: str,
    customers: int,
    seed: int,
    soak: bool,
    allow_server_restart: bool,
    as_json: bool,
    mutations: tuple[str, ...],
) -> None:
    """Run the logistics weekly digest under injected faults — killed, stopped and paused
    workers, dropped connections, provider storms, clock jumps — and check the guarantees
    (docs/guarantees.md). Exit 1 on any violation, with per-key evidence and the command that
    runs the scenario again."""
    from oncebox.chaos import report  # noqa: PLC0415
    from oncebox.chaos.scenarios import SCENARIOS  # noqa: PLC0415

    if name not in ("ci", "all") and name not in SCENARIOS:
        raise click.BadParameter(
            f"unknown scenario {name!r}; use ci, all, or one of: {', '.join(SCENARIOS)}",
            param_hint="--scenario",
        )
    from oncebox.chaos.mutations import MUTATIONS  # noqa: PLC0415

    for mutation in mutations:
        caught = MUTATIONS.get(mutation)
        if caught is not None and caught.caught_by_test:  # no scenario opens its race
            click.echo(
                f"note: {mutation} is caught by a test, not a scenario: "
                f"pytest '{caught.must_fail}'",
                err=True,
            )
    verbose = click.get_current_context().find_root().params.get("verbose", 0)
    logging.getLogger("oncebox").setLevel(logging.WARNING if verbose else logging.ERROR)
    os.environ.pop("ONCEBOX_EMAIL", None)  # the harness's providers are its own
    with reported():
        results = report.run_selected(
            name,
            server=db,
            customers=customers,
            seed=seed,
            mutations=mutations,
            allow_server_restart=allow_server_restart,
            soak=soak,
            as_json=as_json,
        )
    sys.exit(0 if results and all(r.ok for r in results) else 1)
