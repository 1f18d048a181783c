"""`manage.py oncebox COMMAND …`: every oncebox command, on this project (see ../../cli.py)."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand

from oncebox.contrib.django.cli import run_cli


class Command(BaseCommand):  # type: ignore[misc]
    help = "oncebox's CLI on this project's box and database (manage.py oncebox --help)."
    prefix: tuple[str, ...] = ()  # the oncebox command a shortcut stands for

    def run_from_argv(self, argv: list[str]) -> None:
        """Everything after the command name goes to oncebox's CLI untouched: its options are
        its own, not Django's."""
        run_cli([*self.prefix, *argv[2:]], f"{os.path.basename(argv[0])} {argv[1]}")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("args", nargs="*")

    def handle(self, *args: str, **_options: Any) -> None:
        """`call_command("oncebox", "status")`: the same, from Python."""
        run_cli([*self.prefix, *args], "oncebox")
