"""`oncebox demo`: the logistics weekly digest end to end (see oncebox.examples.logistics)."""

from __future__ import annotations

import sys

import click

from oncebox.cli.common import reported
from oncebox.kernel.errors import OnceboxError


def _check_week(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    from oncebox.jobs.periods import iso_week  # noqa: PLC0415 (keeps start-up light)

    if value is not None:
        try:
            iso_week.check(value)
        except OnceboxError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@click.command()
@click.option(
    "--db",
    metavar="URL",
    default="sqlite:///oncebox-demo.db",
    show_default=True,
    help="Database for the demo (reset first when it is the default file).",
)
@click.option(
    "--customers",
    type=click.IntRange(3, 1_000_000),
    default=300,
    show_default=True,
    help="How many freight customers to seed.",
)
@click.option(
    "--period",
    metavar="YYYY-Www",
    callback=_check_week,
    help="The ISO week to send (default: the current one).",
)
@click.option(
    "--email",
    metavar="URL",
    help="Send through this provider (smtp://…, resend://…) instead of the file sink. Not read "
    "from ONCEBOX_EMAIL: a demo never mails real addresses unless told to here.",
)
@click.option("--no-faults", is_flag=True, help="Run without injected faults.")
def demo(db: str, customers: int, period: str | None, email: str | None, no_faults: bool) -> None:
    """Run the logistics weekly digest end to end under injected faults, then check that every
    eligible customer has one digest and nothing was sent twice (exit 1 with the evidence if
    not)."""
    from oncebox.examples.logistics import demo as logistics  # noqa: PLC0415

    options = logistics.DemoOptions(
        db=db, customers=customers, period=period, email=email, faults=not no_faults
    )
    with reported():
        code = logistics.main(options)
    sys.exit(code)
