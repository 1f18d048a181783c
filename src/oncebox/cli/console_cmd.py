"""`oncebox console`: the operator console, served; `oncebox console hash-password`: a user's
password hash for the users file."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from oncebox.cli.common import app_option, box_for_admin, db_option, fail, reported, say
from oncebox.console.login_token import LoginToken, login_link
from oncebox.console.users import hash_password, parse_users
from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.extras import needs
from oncebox.kernel.public_url import WILDCARD, HostCheck, PublicUrl, for_server, parse

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
    """What `console` and `serve` share: where to listen, where browsers and callers reach it,
    and how a reverse proxy fronts it."""
    for option in reversed(
        [
            click.option(
                "--bind", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to serve on."
            ),
            click.option(
                "--public-url",
                "public_urls",
                multiple=True,
                help="The URL browsers and callers use (https://ops.example/oncebox); requests "
                "naming another host are refused. Default: the bind address. Repeat it for "
                "another name callers use (links show the first).",
            ),
            click.option(
                "--root-path",
                default="",
                help="The path prefix a reverse proxy serves it under (default: the public "
                "URL's path).",
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


@dataclass(frozen=True)
class Served:
    """Where a command serves: the address it listens on, its root path, its public URL."""

    host: str
    port: int
    root_path: str
    public: PublicUrl

    @property
    def base(self) -> str:
        """What its start lines show: the public URL, root path included, no trailing slash."""
        return self.public.base


def checked_web_options(bind: str, root_path: str, public_urls: Sequence[str]) -> Served:
    """Where to listen and be reached; a bad `--bind`, `--root-path` or `--public-url`, or a
    public URL whose path is not the root path, exits 2 (a public URL's path is the root path
    when `--root-path` is not given; without a path, it takes `--root-path`). Listening on
    every address without a public URL is said: only the loopback names are answered then."""
    host, port = bind_address(bind)
    if root_path and (not root_path.startswith("/") or root_path.endswith("/")):
        fail(f"--root-path {root_path!r}: a path such as /oncebox (a leading /, no trailing /)", 2)
    first = public_urls[0] if public_urls else None
    try:
        public = for_server(first, host, port, root_path, public_urls[1:])
        paths = [(url, parse(url)[3]) for url in public_urls]
    except ConfigurationError as exc:
        fail(f"--public-url: {exc}", 2)
    prefix = root_path or public.path
    for url, path in paths:
        if path and path != prefix:  # a URL without a path is an origin: the root path follows
            fail(
                f"--public-url {url!r}: its path is {path or '/'!r}, the root path "
                f"{prefix or '/'!r}: give the same prefix (or --public-url alone)",
                2,
            )
    if first is None and host.lower() in WILDCARD:
        say(
            f"listening on every address ({host}) without --public-url: only requests for "
            "localhost, 127.0.0.1 or ::1 are answered; give --public-url with the URL browsers "
            "and callers use",
            err=True,
        )
    return Served(host, port, public.path, public)


def run_web(web: Any, served: Served, forwarded_allow_ips: str | None) -> None:
    """Serve `web` with uvicorn until interrupted (the caller has checked its extra: `needs`),
    refusing a request whose Host is not this server's (`oncebox.kernel.public_url.HostCheck`).
    Without `--forwarded-allow-ips`, the first request through a proxy says on stderr that
    every client is seen as the proxy's address."""
    import uvicorn  # noqa: PLC0415

    from oncebox.console.forwarded import UntrustedProxyWarning  # noqa: PLC0415 (Starlette)

    if forwarded_allow_ips is None:
        web = UntrustedProxyWarning(web, lambda text: say(f"oncebox: warning: {text}", err=True))

    sys.stdout.flush()  # what was said at start, before the server runs (a log or a pipe reads it)
    uvicorn.run(
        HostCheck(web, served.public),
        host=served.host,
        port=served.port,
        root_path=served.root_path,
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips or "",
        server_header=False,
        log_level="warning",
    )


def say_login_link(base: str, login_token: LoginToken) -> None:
    """Print a new one-time login link on this terminal, and print another on each SIGHUP (each
    kills the one before)."""
    minutes = round(login_token.ttl_s / 60)

    def said() -> None:
        say(f"no users configured: log in at {login_link(base, login_token.renew())}")
        say(
            f"(the link works once, within {minutes} minutes; `kill -HUP {os.getpid()}` prints "
            "a new one)"
        )
        sys.stdout.flush()

    said()
    if hasattr(signal, "SIGHUP"):
        # off the signal handler: it may interrupt a print, or `exchange` holding the lock
        signal.signal(signal.SIGHUP, lambda _n, _f: threading.Thread(target=said).start())


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
    public_urls: tuple[str, ...],
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
    served = checked_web_options(bind, root_path, public_urls)
    users, source = console_users(users_file)
    with reported():
        box = box_for_admin(app, db)
    web = create_app(box, ConsoleSettings(users=users, public_url=served.public))
    say(f"oncebox console for {box.where} at {served.base}/")
    if users:
        say(f"{len(users)} user(s) from {source}")
    else:
        say_login_link(served.base, web.state.login_token)
    run_web(web, served, forwarded_allow_ips)


@console.command("hash-password")
def hash_password_cmd() -> None:
    """Read a password (twice, not echoed) and print its hash for the users file."""
    password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    try:
        say(hash_password(password))
    except ConfigurationError as exc:
        fail(str(exc), 2)
