"""`oncebox clock show|reset`: the database's clock — real, or frozen or offset by a test.

Every process reads business time from the database (`oncebox_now()`); tests, the demo and the
chaos harness freeze or offset it for all of them at once, through a setting that names its
owner and lapses soon after the owner dies. `show` says what the clock is; `reset` puts it back
to real time at once (audited), for when the owner is gone and its setting has not lapsed yet,
or never will (one written without a lease)."""

from __future__ import annotations

import click

from oncebox.cli.common import (
    actor_option,
    app_option,
    box_for_admin,
    db_option,
    json_option,
    print_json,
    reason_option,
    reported,
    say,
)
from oncebox.kernel.clock import ClockSetting
from oncebox.shapes import clock_shape
from oncebox.store.params import Audit, reason_text


@click.group()
def clock() -> None:
    """The database's clock: real, or frozen or offset by a test or the demo."""


@clock.command("show")
@app_option
@db_option
@json_option
def clock_show(app: str | None, db: str | None, as_json: bool) -> None:
    """What `oncebox_now()` returns, who set it, and until when."""
    with reported():
        box = box_for_admin(app, db)
        setting, now = box.store.clock_get(), box.store.clock_now()
    if as_json:
        print_json(clock_shape(setting, now))
        return
    say(f"clock: {setting.describe()}")
    say(f"now:   {now.isoformat()}")


@clock.command("reset")
@app_option
@db_option
@reason_option
@actor_option
def clock_reset(app: str | None, db: str | None, reason: str, actor: str) -> None:
    """Back to real time for every process, at once; audited with what the setting was."""
    with reported():
        audit = Audit(actor, reason_text(reason))
        box = box_for_admin(app, db)
        was = box.store.clock_get()
        box.store.clock_set(ClockSetting(), audit)
    if was.frozen_at is None and was.offset is None:
        say("the clock was already real; nothing to reset (recorded in the audit log)")
    else:
        say(f"clock reset to real time (it was {was.describe()})")
