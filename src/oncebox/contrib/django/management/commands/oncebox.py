"""`manage.py oncebox COMMAND …`: every oncebox command, on this project (see ../../cli.py)."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from oncebox.contrib.django.cli import run_cli


class Command(BaseCommand):  # type: ignore[misc]
    help = "oncebox's CLI on this project's box and database (manage.py oncebox --help)."
    prefix: tuple[str, ...] = ()  # the oncebox command a shortcut stands for

    def run_from_argv(self, argv: list[str]) -> None:
        """Everything after the command name goes to oncebox's CLI untouched — its options are
        its own — except Django's `--settings` and `--pythonpath`, which manage.py has already
        applied."""
        run_cli(
            [*self.prefix, *_without_djangos(argv[2:])], f"{os.path.basename(argv[0])} {argv[1]}"
        )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs="*")

    def handle(self, *args: str, **_options: Any) -> None:
        """`call_command("oncebox", "status")`: the same, from Python; a failure is Django's
        CommandError, success returns."""
        try:
            run_cli([*self.prefix, *args], "oncebox")
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                raise CommandError(f"oncebox {' '.join(args)} exited {exit_.code}") from None


_DJANGOS = ("--settings", "--pythonpath")


def _without_djangos(args: list[str]) -> list[str]:
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DJANGOS:
            skip = True  # its value follows
        elif not arg.startswith(tuple(f"{name}=" for name in _DJANGOS)):
            kept.append(arg)
    return kept
