"""`oncebox …`: the command line. One module per family of commands; `common` holds what they
share (options, errors, output) and `shapes` the `--json` shapes."""

from __future__ import annotations

from oncebox.cli.app import main

__all__ = ["main"]
