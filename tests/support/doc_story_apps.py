"""The user's modules of the docs' story (tests/support/doc_story.py), written into its directory
before it starts: three other versions of the freight app's code that meet the same database
(the key-drift guard's examples), a module pinned to another database, a shop, and a process that
freezes the database's clock until it is killed."""

from __future__ import annotations

# Another module on the same database: its digest task mints other keys, it declares a schedule
# named like the task, and it lacks the freight app's schedule.
INVOICING = """\
from oncebox import Box
from oncebox.jobs.periods import iso_week

box = Box()
box.channel("email")


@box.task(key="invoice/{customer_id}/{period}")
def weekly_digest(ctx, customer_id: int, period: str) -> None:
    ctx.outbox.email(to=f"billing{customer_id}@customer.example", subject=period, text="invoice")


@box.schedule("weekly_digest", cron="0 6 * * MON", tz="UTC", period=iso_week, task=weekly_digest)
def invoiced_customers(ctx):
    return []
"""

# The freight app after a rename of its task: jobs of the old name wait with nobody to run them.
RENAMED = """\
from oncebox import Box
from oncebox.jobs.periods import iso_week

box = Box()
box.channel("email")


@box.task(key="weekly-digest/customer-{customer_id}/{period}")
def send_weekly_digest(ctx, customer_id: int, period: str) -> None:
    ctx.outbox.email(to=f"ops{customer_id}@customer.example", subject=period, text="digest")


@box.schedule("weekly-digest", cron="0 9 * * MON", tz="UTC", period=iso_week,
              task=send_weekly_digest)
def active_customers(ctx):
    return []
"""

# A careless refactor: the digest key lost its `customer-` prefix, the schedule moved to Berlin.
FREIGHTAPP_V2 = """\
from oncebox import Box
from oncebox.jobs.periods import iso_week

box = Box()
box.channel("email")


@box.task(key="weekly-digest/{customer_id}/{period}")
def weekly_digest(ctx, customer_id: int, period: str) -> None:
    ctx.outbox.email(to=f"ops{customer_id}@customer.example", subject=period, text="digest")


@box.schedule("weekly-digest", cron="0 9 * * MON", tz="Europe/Berlin", period=iso_week,
              task=weekly_digest)
def active_customers(ctx):
    return []
"""

# An app whose Box names its own database, so a different --db is a mistake.
PINNED = 'from oncebox import Box\n\nbox = Box("sqlite:///fresh2.db")\n'

# A shop with one task and no schedule (a scheduler's first tick could fan out a week).
SHOP = """\
from oncebox import Box

box = Box()
box.channel("email")


@box.task(key="weekly-digest/customer-{customer_id}/{period}")
def weekly_digest(ctx, customer_id: int, period: str) -> None:
    ctx.outbox.email(to=f"ops@customer-{customer_id}.example", subject=period, text="...")
"""

# A process that freezes the database's clock and is then killed: its setting outlives it.
HOLD_CLOCK = """\
import sys
from datetime import UTC, datetime, timedelta
from oncebox.kernel.clock import ClockLease
from oncebox.store import open_store

ClockLease(open_store(sys.argv[1]), timedelta(minutes=10)).set(
    frozen_at=datetime(2026, 11, 30, 9, 1, tzinfo=UTC))
print("held", flush=True)
sys.stdin.read()
"""


MODULES = {
    "invoicing.py": INVOICING,
    "freightapp_renamed.py": RENAMED,
    "freightapp_v2.py": FREIGHTAPP_V2,
    "pinned.py": PINNED,
    "shop.py": SHOP,
}
