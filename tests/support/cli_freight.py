"""The logistics example as a user's app module: `oncebox … --app support.cli_freight`."""

from __future__ import annotations

from oncebox.examples.logistics.app import build_box

box = build_box()  # reads ONCEBOX_DB and ONCEBOX_EMAIL, as a production app should
