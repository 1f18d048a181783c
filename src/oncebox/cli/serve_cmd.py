"""`oncebox serve`: the HTTP API (and, with --console, the console beside it)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from oncebox.cli.common import app_option, db_option, fail, load_app, reported, say
from oncebox.cli.console_cmd import USERS_ENV, bind_address, console_users
from oncebox.store.migrations import check_runnable


@click.command()
@click.option("--bind", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to serve on.")
@click.option(
    "--console",
    "with_console",
    is_flag=True,
    help="Serve the operator console too, under /console.",
)
@click.option(
    "--users-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help=f"The console's users (or set {USERS_ENV}); with --console.",
)
@click.option("--root-path", default="", help="The path prefix a reverse proxy serves it under.")
@click.option(
    "--forwarded-allow-ips",
    default=None,
    help="Trust X-Forwarded-* headers from these proxy addresses only (comma-separated).",
)
@app_option
@db_option
def serve(
    *,
    bind: str,
    with_console: bool,
    users_file: Path | None,
    root_path: str,
    forwarded_allow_ips: str | None,
    app: str | None,
    db: str | None,
) -> None:
    """The HTTP API for your Box's tasks and schedules: enqueue from any language, read a key's
    receipts and the periods, replay a dead letter, fire a schedule from an outside cron.
    Every route needs an API key (oncebox api-keys create); GET /openapi.json describes it."""
    try:
        import uvicorn  # noqa: PLC0415

        from oncebox.api import ApiSettings, create_api  # noqa: PLC0415
    except ImportError as exc:
        fail(f"the API needs the console's extra: pip install 'oncebox[console]' ({exc})", 1)
    host, port = bind_address(bind)
    if root_path and (not root_path.startswith("/") or root_path.endswith("/")):
        fail(f"--root-path {root_path!r}: a path such as /oncebox (a leading /, no trailing /)", 2)
    if users_file is not None and not with_console:
        fail("--users-file is the console's: add --console", 2)
    with reported():
        box = load_app(app, db)
        check_runnable(box.store.schema_status(), box.where)
        keys = [k for k in box.store.api_key_list() if k.revoked_at is None]
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}{root_path}"
    web = create_api(box, ApiSettings(base_url=base))
    say(f"oncebox API for {box.where} at {base}/ ({len(box.registry.all())} task(s))")
    if not keys:
        say("no live API key: every request is refused until `oncebox api-keys create`")
    if with_console:
        from oncebox.api.mounts import beside  # noqa: PLC0415
        from oncebox.console.app import ConsoleSettings, create_app  # noqa: PLC0415

        users, source = console_users(users_file)
        console = create_app(box, ConsoleSettings(users=users))
        web = beside(web, {"/console": console})
        if users:
            say(f"console at {base}/console/, {len(users)} user(s) from {source}")
        else:
            token = console.state.token
            say(f"console at {base}/console/; log in at {base}/console/login?token={token}")
    sys.stdout.flush()
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
