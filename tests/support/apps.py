"""Task definitions shared by tests that run workers in other processes (spawned children import
this module, so the tasks must live at module level, not inside a test)."""

from __future__ import annotations

import os
import threading
from typing import Any

from oncebox import Box, JobContext, Retry
from support.db import record_effect


def digest_box(url: str, **box_options: Any) -> Box:
    """A box with the weekly digest task recording one effect row per run."""
    box = Box(url, **box_options)

    @box.task(key="weekly-digest/customer-{customer_id}/{period}", retry=Retry(max_attempts=5))
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        record_effect(ctx, f"{os.getpid()}:{threading.current_thread().name}")

    return box
