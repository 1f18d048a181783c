"""Deprecated: the key-drift guard lives in `oncebox.jobs.keyguard`. Importing this module warns,
naming the import that replaces it, and still gives the same names."""

from __future__ import annotations

import warnings

from oncebox.jobs.keyguard import (
    RECHECK_AFTER,
    CanaryStatus,
    Drift,
    KeyGuard,
    schedule_canary,
    task_canary,
)

warnings.warn(
    "oncebox.keyguard is deprecated: import from oncebox.jobs.keyguard",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["RECHECK_AFTER", "CanaryStatus", "Drift", "KeyGuard", "schedule_canary", "task_canary"]
