"""An app module for `oncebox prune` tests (tests/test_retention.py): the tasks of its digest box,
with the box's default retention."""

from __future__ import annotations

from oncebox import Box, JobContext
from oncebox.retention.policy import FOREVER

box = Box()  # reads ONCEBOX_DB


@box.task(key="digest/{customer}")
def digest(ctx: JobContext, customer: int) -> None:
    ctx.outbox.email(to=f"c{customer}@example.com", subject="week", text="hello")


@box.task(key="invoice/{n}", keep_jobs=FOREVER)
def invoice(ctx: JobContext, n: int) -> None:
    pass
