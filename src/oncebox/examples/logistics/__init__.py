"""The logistics example: a freight SaaS sends each active customer one weekly digest of its
shipments, and dock-slot holds expire with a notice. `oncebox demo` runs it end to end.

    from oncebox.examples.logistics import build_box
    box = build_box("sqlite:///freight.db")

It is also an app the commands can use (`--app oncebox.examples.logistics`): its `box`, built
when first asked for, opens `ONCEBOX_DB` — by default the demo's own `oncebox-demo.db` — and sends
through `ONCEBOX_EMAIL`, by default into the demo's `oncebox-demo-outbox` folder:

    oncebox status --app oncebox.examples.logistics
    oncebox worker --app oncebox.examples.logistics --until-idle

See `app.py` for the tasks, the schedule and the sweeper, and `demo.py` for the demo run.
"""

from __future__ import annotations

import os
from typing import Any

from oncebox.examples.logistics.app import build_box, create_tables

__all__ = ["box", "build_box", "create_tables"]

DEMO_DB = "sqlite:///oncebox-demo.db"
DEMO_OUTBOX = "file://oncebox-demo-outbox"
_built: list[Any] = []


def __getattr__(name: str) -> Any:
    """`box`, built on first use only: importing the package (the demo does) opens nothing."""
    if name != "box":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _built:
        _built.append(
            build_box(
                os.environ.get("ONCEBOX_DB") or DEMO_DB,
                email=os.environ.get("ONCEBOX_EMAIL") or DEMO_OUTBOX,
            )
        )
    return _built[0]
