"""Put this folder first on PYTHONPATH with STORY_CLOCK_SHIFT_US set, and the interpreter's
oncebox reads the host's clock that many microseconds off: the docs' story happens in its own
week (support/doc_story.py), however long ago that week now is, so what ages with time — payloads
past retention, leases, the schedule's next fire — prints as it did when the story was written.
Every process of one story gets the same shift, so they agree with one another as processes on
one host do. Python imports `sitecustomize` before the program, so the shifted `real_now` is
the one every oncebox module binds."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

SHIFT = os.environ.get("STORY_CLOCK_SHIFT_US")

if SHIFT:
    from oncebox.kernel import clock

    _shift = timedelta(microseconds=int(SHIFT))

    def _shifted_now() -> datetime:
        return datetime.now(UTC) + _shift

    clock.real_now = _shifted_now
