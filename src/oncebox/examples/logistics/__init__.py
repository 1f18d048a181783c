"""The logistics example: a freight SaaS sends each active customer one weekly digest of its
shipments, and dock-slot holds expire with a notice. `oncebox demo` runs it end to end.

    from oncebox.examples.logistics import build_box
    box = build_box("sqlite:///freight.db")

See `app.py` for the tasks, the schedule and the sweeper, and `demo.py` for the demo run.
"""

from __future__ import annotations

from oncebox.examples.logistics.app import build_box, create_tables

__all__ = ["build_box", "create_tables"]
