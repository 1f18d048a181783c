"""Running a command as if the host's clock read another instant (support/story_clock).

What a worker does depends on when it runs: on a Monday within a weekly schedule's grace after its
09:00 fire, its scheduler rightly fans out that week. A test that shows what a command prints on
an ordinary day — the README's example, a worker's summary line — runs it on a day of its own
(`README_WEEK_THURSDAY`), whatever day the suite runs on.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

STORY_CLOCK = Path(__file__).resolve().parent / "story_clock"  # its sitecustomize shifts the clock
# the week the README's example enqueues (2026-W33), on its Thursday: no schedule's fire is due
README_WEEK_THURSDAY = datetime(2026, 8, 13, 12, tzinfo=UTC)


def host_clock_at(instant: datetime, pythonpath: str = "") -> dict[str, str]:
    """The variables a child process needs to read the host's clock as if now were `instant`:
    the story clock first on its PYTHONPATH (then `pythonpath`), and the shift from the host's
    own clock — not this process's `real_now`, which a run under the story clock shifts too."""
    shift = instant - datetime.now(UTC)
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(STORY_CLOCK), pythonpath])),
        "STORY_CLOCK_SHIFT_US": str(shift // timedelta(microseconds=1)),
    }
