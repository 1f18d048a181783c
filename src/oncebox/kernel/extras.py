"""The optional parts of oncebox, imported only where they are used.

`pip install oncebox` installs the core: the library, the worker and every command but the web
ones. The console and the HTTP API (Starlette, uvicorn), handlers' SQLAlchemy sessions, the
brokers' clients, Django's app and OpenTelemetry's spans each come with an extra of
pyproject.toml. Nothing on the import path of `oncebox` or of its CLI imports them: code that
needs one imports it inside `needs(extra, what)`, so a missing one is a `MissingExtra` — one line
naming the extra to install (exit 2 from the CLI) — instead of a ModuleNotFoundError from deep
inside, or a CLI that cannot start at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from oncebox.kernel.errors import MissingExtra


@contextmanager
def needs(extra: str, what: str) -> Iterator[None]:
    """Import what `extra` installs inside this block; a module missing is `MissingExtra` for
    `what`. oncebox's own modules are never missing: one that is raises as it is (a bug)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "oncebox":
            raise
        raise MissingExtra(extra, what, exc.name) from exc
