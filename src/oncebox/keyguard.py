"""Compatibility: the key-drift guard lives in `oncebox.jobs.keyguard`; this module keeps the
name the guide and CHANGELOG use."""

from __future__ import annotations

from oncebox.jobs.keyguard import (
    RECHECK_AFTER,
    CanaryStatus,
    Drift,
    KeyGuard,
    schedule_canary,
    task_canary,
)

__all__ = ["RECHECK_AFTER", "CanaryStatus", "Drift", "KeyGuard", "schedule_canary", "task_canary"]
