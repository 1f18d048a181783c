"""An interrupted fan-out is resumed before any catch-up policy applies: a scheduler that died
half-way through a period, and was not replaced until the next fire had passed, must not leave
the rest of that period's eligible set without jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from oncebox.kernel import points
from oncebox.testing import FrozenClock
from support.digest_schedule import digest_keys, scheduled_box

MONDAY_W33 = datetime(2026, 8, 10, 9, 0, 30, tzinfo=UTC)


def keys(customers, week: str) -> list[str]:
    return [f"weekly-digest/customer-{c}/{week}" for c in customers]


def die_half_way(box) -> None:
    """The scheduler stops after its first batch, as if killed: its run stays `running`."""
    with (
        points.installed({"scheduler.between_batches": points.raising(SystemExit(9))}),
        pytest.raises(SystemExit),
    ):
        box.ticker().run_once()
    [run] = box.store.schedule_run_list("weekly-digest")
    assert (run.period, run.state) == ("2026-W33", "running")


@pytest.mark.parametrize("catch_up", ["latest", "none", "all"])
def test_a_run_interrupted_before_the_next_fire_is_resumed_whatever_the_catch_up(
    store_url, catch_up
):
    box = scheduled_box(store_url, customers=5, batch_size=2, catch_up=catch_up)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_half_way(box)
            assert digest_keys(box) == keys([1, 2], "2026-W33")
            clock.advance(timedelta(days=7))  # W34's fire has passed; the dead lease expired
            fan_outs = box.ticker().run_once().fan_outs
            assert [(f.period, f.claimed, f.eligible, f.enqueued) for f in fan_outs] == [
                ("2026-W33", True, 5, 3),
                ("2026-W34", True, 5, 5),
            ]
        assert digest_keys(box) == sorted(
            keys(range(1, 6), "2026-W33") + keys(range(1, 6), "2026-W34")
        )
        runs = {run.period: run.state for run in box.store.schedule_run_list("weekly-digest")}
        assert runs == {"2026-W33": "done", "2026-W34": "done"}
    finally:
        box.close()


def test_an_operator_rerun_takes_over_a_dead_owners_expired_run(store_url):
    box = scheduled_box(store_url, customers=5, batch_size=2)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_half_way(box)
            clock.advance(timedelta(days=7))
            result = box.run_schedule("weekly-digest", "2026-W33")
            assert (result.claimed, result.eligible, result.enqueued) == (True, 5, 3)
        assert digest_keys(box) == keys(range(1, 6), "2026-W33")
    finally:
        box.close()
