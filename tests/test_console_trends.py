"""The overview's chart: per-minute rates from two readings of the durable counters over the
store's time between them, and the backlog from the depths; served to logged-in users only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from oncebox import Box, JobContext
from oncebox.console import ConsoleSettings, create_app
from oncebox.console.trends import Trends
from oncebox.testing import FrozenClock
from test_console import USERS, client, logged_in

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def noop_box(url: str) -> Box:
    box = Box(url)

    @box.task(key="n/{n}")
    def noop(ctx: JobContext, n: int) -> None:
        pass

    return box


def test_rates_are_counter_differences_over_the_store_time_between_samples(store_url):
    box = noop_box(store_url)
    trends = Trends(box.store)
    with FrozenClock(box, at=T0) as clock:
        box.enqueue_many("noop", [{"n": n} for n in range(30)])
        trends.sample()
        box.work(until_idle=True)
        box.enqueue_many("noop", [{"n": n} for n in range(30, 35)])
        clock.advance(timedelta(minutes=2))
        trends.sample()
        trends.sample()  # the same store time again: not a new point
    series = trends.series()
    assert series["t"] == [T0.timestamp(), (T0 + timedelta(minutes=2)).timestamp()]
    assert series["ready"] == [30, 5]
    assert series["completed_per_min"] == [None, 15.0]  # 30 completed over two minutes
    assert series["sent_per_min"] == [None, 0.0]
    box.close()


def test_the_samples_are_served_to_a_logged_in_user_only(sqlite_url):
    box = noop_box(sqlite_url)
    app = create_app(box, ConsoleSettings(users=USERS))
    assert client(app).get("/trends.json").status_code == 303
    app.state.trends.sample()
    served = logged_in(app, "vic").get("/trends.json").json()
    assert set(served) == {"t", "ready", "pending", "completed_per_min", "sent_per_min"}
    assert len(served["t"]) == 1
    box.close()
