"""A box with a customers table and the weekly-digest schedule over its active customers."""

from __future__ import annotations

from typing import Any

from oncebox import Box, JobContext, ScheduleContext
from oncebox.jobs.periods import iso_week
from support.db import sql


def scheduled_box(url: str, *, customers: int = 0, **schedule: Any) -> Box:
    box = Box(url, seed=3)
    sql(box, "CREATE TABLE IF NOT EXISTS customers (id INTEGER PRIMARY KEY, active INTEGER)")
    add_customers(box, range(1, customers + 1))

    @box.task(key="weekly-digest/customer-{customer_id}/{period}")
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        pass

    options: dict[str, Any] = {
        "cron": "0 9 * * MON",
        "tz": "UTC",
        "period": iso_week,
        "task": "weekly_digest",
        **schedule,
    }

    @box.schedule("weekly-digest", **options)
    def active_customers(ctx: ScheduleContext) -> Any:
        cursor = ctx.connection.execute("SELECT id FROM customers WHERE active = 1 ORDER BY id")
        for (customer_id,) in cursor:
            yield {"customer_id": customer_id, "period": ctx.period}

    return box


def add_customers(box: Box, ids: Any) -> None:
    for customer in ids:
        sql(box, "INSERT INTO customers (id, active) VALUES (?, 1)", (customer,))


def digest_keys(box: Box) -> list[str]:
    return sorted(row[0] for row in sql(box, "SELECT key FROM oncebox_all_jobs"))
