"""The rows tests seed for a week of their own stay that week's on any day the suite runs: on a
Monday within a weekly schedule's grace after its 09:00 fire, a worker's scheduler rightly fans
out the current week, and the box every input surface is tested against (support/surfaces.py)
must not take it in — its counts are what those tests read."""

from __future__ import annotations

from datetime import UTC, datetime

from oncebox import Box
from oncebox.jobs.periods import iso_week
from oncebox.store.params import JobFilter, OutboxFilter
from oncebox.testing import FrozenClock
from support.surfaces import PERIOD, seeded_box

MONDAY_JUST_AFTER_THE_FIRE = datetime(2026, 12, 14, 9, 2, tzinfo=UTC)  # within its 10 min grace


def test_the_seeded_box_holds_its_own_week_alone_on_a_monday_just_after_the_fire(tmp_path):
    url = f"sqlite:///{tmp_path / 'monday.db'}"
    holder = Box(url)
    clock = FrozenClock(holder, at=MONDAY_JUST_AFTER_THE_FIRE)
    try:
        box = seeded_box(url)
        try:
            jobs = {
                job.key: (job.state, job.attempt)
                for job in box.store.job_list(JobFilter(limit=100))
            }
            messages = {row.key: row.state for row in box.store.outbox_list(OutboxFilter())}
            assert jobs == {
                f"weekly-digest/customer-1/{PERIOD}": ("done", 1),
                f"weekly-digest/customer-2/{PERIOD}": ("done", 1),
                f"weekly-digest/customer-3/{PERIOD}": ("done", 1),
                f"weekly-digest/customer-4/{PERIOD}": ("dead", 2),  # replayed once
            }
            assert messages == {
                f"weekly-digest/customer-1/{PERIOD}": "sent",
                f"weekly-digest/customer-2/{PERIOD}": "dead",
                f"weekly-digest/customer-3/{PERIOD}": "ambiguous",
            }
            # the hazard is real at that instant: a worker with its scheduler fans out the week
            box.work(until_idle=True)
            weeks = {job.period for job in box.store.job_list(JobFilter(limit=100))}
            assert weeks == {PERIOD, iso_week(MONDAY_JUST_AFTER_THE_FIRE)}
        finally:
            box.close()
    finally:
        clock.release()
        holder.close()
