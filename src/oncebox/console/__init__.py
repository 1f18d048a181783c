"""The operator console: a small server-rendered web app over the same store code as the CLI.

`oncebox console --bind 127.0.0.1:8080` serves it (`create_app` builds the ASGI app, to mount
elsewhere). It shows the numbers `oncebox status` shows (`oncebox.status`), a key's receipt chain
(`oncebox.jobs.receipts`), the jobs, the outbox, the dead letters, the held sends and the audit log,
and it acts through `oncebox.runtime.operations`, as the CLI does: it computes and decides nothing
of its own. Deny by default: every page needs a logged-in user (`console.users`), every change a
POST with the session's CSRF token from the console's own origin (`console.guard`).

`create_app` and `ConsoleSettings` are imported when first asked for: Starlette comes with the
`console` extra, and `oncebox console hash-password` (`users.py`) must work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oncebox.console.app import ConsoleSettings, create_app

__all__ = ["ConsoleSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from oncebox.console import app  # noqa: PLC0415 (Starlette: an extra)

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
