"""The logistics app after a careless refactor: the digest key lost its `customer-` prefix and
the schedule moved to Berlin time. The key-drift guard must refuse both."""

from __future__ import annotations

from typing import Any

from oncebox import Box, JobContext, ScheduleContext
from oncebox.jobs.periods import iso_week

box = Box()
box.channel("email")


@box.task(key="weekly-digest/{customer_id}/{period}")
def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
    ctx.outbox.email(to=f"ops{customer_id}@customer.example", subject=period, text="digest")


@box.schedule(
    "weekly-digest", cron="0 9 * * MON", tz="Europe/Berlin", period=iso_week, task="weekly_digest"
)
def active_customers(ctx: ScheduleContext) -> Any:
    return []
