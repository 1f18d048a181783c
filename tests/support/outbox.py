"""A box whose task writes one email per customer, on a channel of the test's choosing."""

from __future__ import annotations

from typing import Any

from oncebox import Box, JobContext, Retry
from oncebox.providers import Provider

SECRET = "outbox-test-secret-0123456789"


def mail_box(url: str, provider: Provider | str, **channel: Any) -> Box:
    box = Box(url, seed=7, secret=SECRET)
    box.channel("email", provider=provider, **channel)

    @box.task(key="weekly-digest/customer-{customer_id}/{period}", retry=Retry(max_attempts=3))
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        ctx.outbox.email(
            to=f"customer-{customer_id}@freight.example",
            subject=f"Your shipments, {period}",
            text=f"Hello customer {customer_id}",
            sender="digest@oncebox.example",
        )

    return box


def enqueue_customers(box: Box, customers: range | list[int], period: str = "2026-W33") -> None:
    box.enqueue_many("weekly_digest", [{"customer_id": c, "period": period} for c in customers])
