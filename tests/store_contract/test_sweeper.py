"""The due-row sweeper: a hold's expiry and its notice commit together, once."""

from __future__ import annotations

import multiprocessing
import signal
from datetime import UTC, datetime, timedelta

import pytest

from oncebox.testing import FrozenClock
from support.holds import add_hold, hold_states, holds_box
from support.procs import sweep_and_die

SPAWN = multiprocessing.get_context("spawn")
T0 = datetime(2026, 8, 17, 14, 0, tzinfo=UTC)


def notices(box) -> list[str]:
    return sorted(
        r.key for i in range(1, 10) for r in box.store.outbox_find_by_key(f"hold-expired/hold-{i}")
    )


def test_expired_holds_are_transitioned_with_their_notice_once(store_url):
    box = holds_box(store_url, batch_size=2)
    try:
        with FrozenClock(box, at=T0) as clock:
            add_hold(box, 1, T0 - timedelta(minutes=5))
            add_hold(box, 2, T0)
            add_hold(box, 3, T0 - timedelta(seconds=1))
            add_hold(box, 4, T0 + timedelta(hours=1))  # not yet due
            add_hold(box, 5, T0 - timedelta(hours=1), state="confirmed")
            sweeper = box.expiry_sweeper("hold-expiry")
            try:
                first = sweeper.run_once()
                second = sweeper.run_once()
                assert (first.handled, second.handled) == (2, 1)  # batches of two
                assert sweeper.run_once().handled == 0
                clock.advance(timedelta(hours=1))
                assert sweeper.run_once().keys == ["hold-expired/hold-4"]
            finally:
                sweeper.close()
        assert hold_states(box) == {
            1: "expired",
            2: "expired",
            3: "expired",
            4: "expired",
            5: "confirmed",
        }
        assert notices(box) == [f"hold-expired/hold-{i}" for i in (1, 2, 3, 4)]
    finally:
        box.close()


@pytest.mark.slow
def test_a_sweeper_killed_between_transition_and_commit_leaves_nothing_half_done(store_url):
    box = holds_box(store_url)
    try:
        with FrozenClock(box, at=T0):
            add_hold(box, 1, T0 - timedelta(minutes=1))
            dying = SPAWN.Process(target=sweep_and_die, args=(store_url,))
            dying.start()
            dying.join(60)
            assert dying.exitcode == -signal.SIGKILL
            assert hold_states(box) == {1: "held"}
            assert notices(box) == [] and box.store.intent_count() == 0
            sweeper = box.expiry_sweeper("hold-expiry")
            try:
                assert sweeper.run_once().keys == ["hold-expired/hold-1"]
            finally:
                sweeper.close()
        assert hold_states(box) == {1: "expired"}
        assert notices(box) == ["hold-expired/hold-1"]
    finally:
        box.close()
