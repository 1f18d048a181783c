"""An app module for CLI tests: `oncebox worker --app support.cli_app`."""

from __future__ import annotations

from oncebox import Box, JobContext, Retry

box = Box()  # reads ONCEBOX_DB, as a production app should


@box.task(key="greeting/{name}", retry=Retry(max_attempts=1))
def greet(ctx: JobContext, name: str) -> None:
    if name == "poison":
        raise ValueError("cannot greet poison")
