"""Working the jobs a test made for a period of its own, and nothing else.

A test whose box declares a weekly schedule, that makes the jobs of a fixed past week itself —
fanned out by hand (`box.run_schedule(name, "2026-W33")`), enqueued, posted over HTTP — and then
runs a worker on the real clock, gets on a Monday within the schedule's grace after its 09:00 fire
a worker whose scheduler rightly fans out the current week too: every count the test reads
changes. Where the test is about what its own jobs become, not about the scheduler, its worker
runs without one.
"""

from __future__ import annotations

from oncebox import Box, WorkerConfig, WorkerResult

SEEDED_ONLY = WorkerConfig(until_idle=True, schedule=False)


def work_seeded(box: Box) -> WorkerResult:
    """`box.work(until_idle=True)` with every lane but the scheduler."""
    return box.work(config=SEEDED_ONLY)
