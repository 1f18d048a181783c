"""`python -m oncebox …`: the `oncebox` command, where no script is on PATH."""

from __future__ import annotations

from oncebox.cli.app import main

main()
