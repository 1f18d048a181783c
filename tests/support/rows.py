"""A job's row and attempts, read through the store, for tests that need them to exist.

`Box.enqueue(...).job_id` is None when nothing was enqueued and `Store.job_get` is None for an id
with no row; a test that expects a row says so here once, and fails naming the id.
"""

from __future__ import annotations

from oncebox import Box
from oncebox.store.records import AttemptRow, JobRow


def job_row(box: Box, job_id: int | None) -> JobRow:
    """The row of job `job_id`, which must exist."""
    assert job_id is not None, "no job id: nothing was enqueued"
    row = box.store.job_get(job_id)
    assert row is not None, f"no job {job_id} in the store"
    return row


def job_attempts(box: Box, job_id: int | None) -> list[AttemptRow]:
    """The recorded attempts of job `job_id`, which must have been enqueued."""
    assert job_id is not None, "no job id: nothing was enqueued"
    return box.store.job_attempt_list(job_id)
