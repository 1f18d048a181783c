"""`oncebox serve`: the HTTP API (and, with --console, the console beside it; the providers'
delivery webhooks under /deliveries when a channel takes them). `oncebox receive`: the delivery
webhooks' receiver alone."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from oncebox.cli.common import app_option, db_option, fail, load_app, reported, say
from oncebox.cli.console_cmd import (
    USERS_ENV,
    checked_web_options,
    console_users,
    run_web,
    say_login_link,
    web_options,
)
from oncebox.kernel.extras import needs
from oncebox.store.migrations import check_runnable

if TYPE_CHECKING:
    from oncebox.box import Box


@click.command()
@web_options
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
@app_option
@db_option
def serve(
    *,
    bind: str,
    public_urls: tuple[str, ...],
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
    with reported(), needs("console", "the HTTP API"):
        import uvicorn  # noqa: F401, PLC0415

        from oncebox.api import ApiSettings, create_api  # noqa: PLC0415
    served = checked_web_options(bind, root_path, public_urls)
    if users_file is not None and not with_console:
        fail("--users-file is the console's: add --console", 2)
    with reported():
        box = load_app(app, db)
        check_runnable(box.store.schema_status(), box.where)
        keys = [k for k in box.store.api_key_list() if k.revoked_at is None]
    base = served.base
    web = create_api(box, ApiSettings(base_url=base))
    say(f"oncebox API for {box.where} at {base}/ ({len(box.registry.all())} task(s))")
    if not keys:
        say("no live API key: every request is refused until `oncebox api-keys create`")
    others: dict[str, Any] = {}
    receiver = _receiver(box, base)
    if receiver is not None:
        others["/deliveries"] = receiver
    if with_console:
        from oncebox.console.app import ConsoleSettings, create_app  # noqa: PLC0415

        users, source = console_users(users_file)
        console = create_app(box, ConsoleSettings(users=users, public_url=served.public))
        others["/console"] = console
        if users:
            say(f"console at {base}/console/, {len(users)} user(s) from {source}")
        else:
            say(f"console at {base}/console/")
            say_login_link(f"{base}/console", console.state.login_token)
    if others:
        from oncebox.api.mounts import beside  # noqa: PLC0415

        web = beside(web, others)
    run_web(web, served, forwarded_allow_ips)


def _receiver(box: Box, base: str) -> Any | None:
    """The delivery webhooks' receiver when a channel takes reports (None otherwise), its
    addresses said; a channel whose secret is not set stops the start with one line."""
    from oncebox.api.deliveries import create_receiver, reporting_channels  # noqa: PLC0415

    channels = reporting_channels(box)
    if not channels:
        return None
    with reported():
        receiver = create_receiver(box)
    for name in channels:
        say(f"provider reports for channel {name!r}: POST {base}/deliveries/{name}")
    return receiver


@click.command()
@web_options
@app_option
@db_option
def receive(
    *,
    bind: str,
    public_urls: tuple[str, ...],
    root_path: str,
    forwarded_allow_ips: str | None,
    app: str | None,
    db: str | None,
) -> None:
    """Receive the providers' signed delivery webhooks alone (no API, no console): each event is
    recorded against its message, and a held send the provider says it took is settled. Point
    the provider's webhook at /CHANNEL for each channel declared with reports=."""
    with reported(), needs("console", "the delivery webhooks' receiver"):
        import uvicorn  # noqa: F401, PLC0415

        from oncebox.api.deliveries import create_receiver, reporting_channels  # noqa: PLC0415
    served = checked_web_options(bind, root_path, public_urls)
    with reported():
        box = load_app(app, db)
        check_runnable(box.store.schema_status(), box.where)
    base = served.base
    channels = reporting_channels(box)
    if not channels:
        fail(
            "no channel takes provider reports: declare one with "
            "box.channel(..., reports=oncebox.Reports(secret_env=...))",
            2,
        )
    with reported():
        web = create_receiver(box)
    for name in channels:
        say(f"provider reports for channel {name!r}: POST {base}/{name}")
    run_web(web, served, forwarded_allow_ips)
