"""`oncebox console`: the operator console, served; `oncebox console hash-password`: a user's
password hash for the users file."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from oncebox.cli.common import app_option, box_for_admin, db_option, fail, reported, say
from oncebox.console.users import hash_password, parse_users
from oncebox.errors import ConfigurationError
from oncebox.extras import needs

F = TypeVar("F", bound=Callable[..., Any])
USERS_ENV = "ONCEBOX_CONSOLE_USERS"


def bind_address(value: str) -> tuple[str, int]:
    host, colon, port = value.rpartition(":")
    if (
        not colon
        or not host
        or not (port.isascii() and port.isdigit())
        or not 0 < int(port) < 65536
    ):
        fail(f"--bind {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080", 2)
    return host.strip("[]"), int(port)


def console_users(users_file: Path | None) -> tuple[dict[str, Any], str]:
    try:
        if users_file is not None:
            try:
                text = users_file.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                fail(f"--users-file {users_file}: cannot read it: {exc}", 2)
            return parse_users(text, str(users_file)), f"{users_file}"
        if os.environ.get(USERS_ENV):
            return parse_users(os.environ[USERS_ENV], USERS_ENV), USERS_ENV
    except ConfigurationError as exc:
        fail(str(exc), 2)
    return {}, ""


def web_options(func: F) -> F:
    """What `console` and `serve` share: where to listen, and how a reverse proxy fronts it."""
    for option in reversed(
        [
            click.option(
                "--bind", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to serve on."
            ),
            click.option(
                "--root-path", default="", help="The path prefix a reverse proxy serves it under."
            ),
            click.option(
                "--forwarded-allow-ips",
                default=None,
                help="Trust X-Forwarded-* headers from these proxy addresses only "
                "(comma-separated).",
            ),
        ]
    ):
        func = option(func)
    return func


def checked_web_options(bind: str, root_path: str) -> tuple[str, int]:
    """The host and port to listen on; a bad `--bind` or `--root-path` exits 2."""
    host, port = bind_address(bind)
    if root_path and (not root_path.startswith("/") or root_path.endswith("/")):
        fail(f"--root-path {root_path!r}: a path such as /oncebox (a leading /, no trailing /)", 2)
    return host, port


def run_web(
    web: Any, host: str, port: int, root_path: str, forwarded_allow_ips: str | None
) -> None:
    """Serve `web` with uvicorn until interrupted (the caller has checked its extra: `needs`).
    Without `--forwarded-allow-ips`, the first request through a proxy says on stderr that
    every client is seen as the proxy's address."""
    import uvicorn  # noqa: PLC0415

    from oncebox.console.forwarded import UntrustedProxyWarning  # noqa: PLC0415 (Starlette)

    if forwarded_allow_ips is None:
        web = UntrustedProxyWarning(web, lambda text: say(f"oncebox: warning: {text}", err=True))

    sys.stdout.flush()  # what was said at start, before the server runs (a log or a pipe reads it)
    uvicorn.run(
        web,
        host=host,
        port=port,
        root_path=root_path,
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips or "",
        server_header=False,
        log_level="warning",
    )


@click.group(invoke_without_command=True)
@web_options
@click.option(
    "--users-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help=f"Users, one `name role hash` per line (or set {USERS_ENV}); none: a login token.",
)
@app_option
@db_option
@click.pass_context
def console(
    ctx: click.Context,
    *,
    bind: str,
    users_file: Path | None,
    root_path: str,
    forwarded_allow_ips: str | None,
    app: str | None,
    db: str | None,
) -> None:
    """The operator console: overview, periods, jobs, outbox, a key's receipt chain, dead
    letters, held sends and the audit log, with replay, discard and resolve for operators.
    Every page needs a login."""
    if ctx.invoked_subcommand is not None:
        return
    with reported(), needs("console", "the console"):
        import uvicorn  # noqa: F401, PLC0415

        from oncebox.console.app import ConsoleSettings, create_app  # noqa: PLC0415
    host, port = checked_web_options(bind, root_path)
    users, source = console_users(users_file)
    with reported():
        box = box_for_admin(app, db)
    web = create_app(box, ConsoleSettings(users=users))
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}{root_path}"
    say(f"oncebox console for {box.where} at {base}/")
    if users:
        say(f"{len(users)} user(s) from {source}")
    else:
        say(f"no users configured: log in at {base}/login?token={web.state.token}")
    run_web(web, host, port, root_path, forwarded_allow_ips)


@console.command("hash-password")
def hash_password_cmd() -> None:
    """Read a password (twice, not echoed) and print its hash for the users file."""
    password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    try:
        say(hash_password(password))
    except ConfigurationError as exc:
        fail(str(exc), 2)
