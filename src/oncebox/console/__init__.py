"""The operator console: a small server-rendered web app over the same store code as the CLI.

`oncebox console --bind 127.0.0.1:8080` serves it (`create_app` builds the ASGI app, to mount
elsewhere). It shows the numbers `oncebox status` shows (`oncebox.status`), a key's receipt chain
(`oncebox.receipts`), the jobs, the outbox, the dead letters, the held sends and the audit log,
and it acts through `oncebox.operations`, as the CLI does: it computes and decides nothing of its
own. Deny by default: every page needs a logged-in user (`console.users`), every change a POST
with the session's CSRF token from the console's own origin (`console.guard`).
"""

from __future__ import annotations

from oncebox.console.app import ConsoleSettings, create_app

__all__ = ["ConsoleSettings", "create_app"]
