"""`manage.py oncebox …`: oncebox's own CLI, on the project's box and database.

The CLI is run as it is (the same commands, options, output and exit codes: 2 for a usage
mistake); only the two things it would otherwise be told are filled in from Django — the box
(`--app`) and its database URL (`--db`), which Django's settings already say.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

APP = "oncebox.contrib.django:box"


def run_cli(args: Sequence[str], prog: str) -> None:
    """Run `oncebox ARGS` for this project; exits like the CLI (SystemExit)."""
    from oncebox.cli.app import main  # noqa: PLC0415 (the CLI's imports, only when run)
    from oncebox.contrib.django.project import get_box  # noqa: PLC0415

    os.environ["ONCEBOX_APP"] = APP
    os.environ["ONCEBOX_DB"] = get_box().store.url
    main.main(args=list(args), prog_name=prog)
