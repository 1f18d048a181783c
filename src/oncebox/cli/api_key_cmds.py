"""`oncebox api-keys create|list|revoke`: who may call the HTTP API, for what, how often."""

from __future__ import annotations

import click

from oncebox.api.keys import DEFAULT_RATE, SCOPES, issue_key, revoke_key
from oncebox.cli.common import (
    actor_option,
    app_option,
    box_for_admin,
    db_option,
    json_option,
    print_json,
    print_table,
    reported,
    say,
)
from oncebox.shapes import instant
from oncebox.store.records import ApiKeyRow


def _shape(row: ApiKeyRow) -> dict[str, object]:
    return {
        "id": row.id,
        "name": row.name,
        "scopes": row.scopes.split(),
        "rate": row.rate,
        "created_at": instant(row.created_at),
        "created_by": row.created_by,
        "revoked_at": instant(row.revoked_at),
    }


@click.group("api-keys")
def api_keys() -> None:
    """The HTTP API's keys: made, listed and revoked here; only their digests are stored."""


@api_keys.command("create")
@click.argument("name")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    required=True,
    type=click.Choice(SCOPES),
    help="What the key may do (repeat): enqueue, read, operate (operate includes read).",
)
@click.option("--rate", default=DEFAULT_RATE, show_default=True, help="Requests per period.")
@actor_option
@app_option
@db_option
@json_option
def create(
    name: str,
    *,
    scopes: tuple[str, ...],
    rate: str,
    actor: str,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Make an API key NAME and print it once: it is not stored, only its digest."""
    with reported():
        box = box_for_admin(app, db)
        issued = issue_key(box.store, name, scopes, rate=rate, by=actor)
    if as_json:
        print_json({**_shape(issued.row), "token": issued.token})
        return
    say(f"API key {issued.row.name} ({issued.row.scopes}, {issued.row.rate}):")
    say(issued.token)
    say("shown once: store it where your callers read secrets (ONCEBOX_API_KEY)", err=True)


@api_keys.command("list")
@app_option
@db_option
@json_option
def list_keys(app: str | None, db: str | None, as_json: bool) -> None:
    """Every API key, live or revoked (never its secret)."""
    with reported():
        box = box_for_admin(app, db)
        rows = box.store.api_key_list()
    if as_json:
        print_json([_shape(row) for row in rows])
        return
    print_table(
        ["NAME", "SCOPES", "RATE", "CREATED", "BY", "REVOKED"],
        [
            [
                r.name,
                r.scopes,
                r.rate,
                instant(r.created_at),
                r.created_by,
                instant(r.revoked_at) or "-",
            ]
            for r in rows
        ],
        "no API key (oncebox api-keys create NAME --scope enqueue)",
    )


@api_keys.command("revoke")
@click.argument("name")
@app_option
@db_option
def revoke(name: str, app: str | None, db: str | None) -> None:
    """Revoke the API key NAME: refused by every server from its next request on."""
    with reported():
        box = box_for_admin(app, db)
        row = revoke_key(box.store, name)
    say(f"API key {row.name} revoked at {instant(row.revoked_at)}")
