"""A running fan-out says who owns it, whether that owner is alive — an owner renews its run
while it fans out; one that stopped renewing is gone — and when its lease ends; an operator
takes a gone owner's run over at once (audited), fenced on the run as the operator read it, and
never a live owner's."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import Box, InvalidState
from oncebox.chaos.mutations import mutated
from oncebox.kernel import points
from oncebox.runtime.fanout import FanOut, TakenOver
from oncebox.schedules import owners
from oncebox.shapes import instant
from oncebox.status import status_data
from oncebox.store import open_store
from oncebox.store.params import AuditFilter
from oncebox.testing import FrozenClock
from support.digest_schedule import digest_keys, scheduled_box
from support.waiting import wait_until

MONDAY_W33 = datetime(2026, 8, 10, 9, 0, 30, tzinfo=UTC)
OWNER = "vm-7:4242:manual"  # the fan-out that died with the store
LEASE = timedelta(minutes=5)  # the schedule's default


def keys(customers: Iterable[int], week: str = "2026-W33") -> list[str]:
    return sorted(f"weekly-digest/customer-{c}/{week}" for c in customers)


def die_half_way(box: Box) -> None:
    """A manual fan-out of 2026-W33 that dies after its first batch (the store went away under
    it): its run stays `running`, its lease five minutes out, and nothing renews it."""
    schedule = box.schedules["weekly-digest"]
    box.store.schedule_state(schedule.name, schedule.grace)  # known to status, as by hand
    fan_out = FanOut(box.runtime, OWNER)
    killed = {"scheduler.between_batches": points.raising(SystemExit(9))}
    with points.installed(killed), pytest.raises(SystemExit):
        fan_out.run(schedule, "2026-W33", None, rescan=True)
    [run] = box.store.schedule_run_list("weekly-digest")
    assert (run.period, run.state, run.owner) == ("2026-W33", "running", OWNER), run


def take_over(box: Box) -> TakenOver:
    return box.take_over_schedule_run(
        "weekly-digest", "2026-W33", reason="the store restarted under it", actor="ops-alice"
    )


def take_overs(box: Box) -> list[tuple[str, str | None, str]]:
    rows = box.store.audit_search(AuditFilter(action="take-over"))
    return [(row.actor, row.target_key, row.reason) for row in rows]


def test_status_says_a_running_fan_outs_owner_whether_it_is_alive_and_its_lease_end(store_url):
    box = scheduled_box(store_url, customers=5, batch_size=2)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_half_way(box)
            clock.advance(timedelta(seconds=10))
            live = status_data(box, 3)
            clock.advance(timedelta(minutes=1))  # a minute without a renewal: gone
            gone = status_data(box, 3)
        fan_out = {
            "schedule": "weekly-digest",
            "period": "2026-W33",
            "owner": OWNER,
            "renewed_at": instant(MONDAY_W33),
            "lease_ends_at": instant(MONDAY_W33 + LEASE),
        }
        assert live["fan_outs"] == [{**fan_out, "owner_live": True}], live["fan_outs"]
        assert gone["fan_outs"] == [{**fan_out, "owner_live": False}], gone["fan_outs"]
        [period] = gone["schedules"][0]["periods"]
        assert period["state"] == "running"
        assert period["fan_out"] == {**fan_out, "owner_live": False}, period
    finally:
        box.close()


def test_a_fan_out_renews_its_run_while_a_batch_holds_it_up(store_url, monkeypatch):
    """The renewals come from their own thread, not from progress: an owner stuck between two
    batches (a slow eligible-set query) stays alive; a finished run is no longer listed."""
    monkeypatch.setattr(owners, "RENEW_EVERY", timedelta(milliseconds=20))
    box = scheduled_box(store_url, customers=5, batch_size=2)
    held_up = points.Pause()
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            schedule = box.schedules["weekly-digest"]
            box.store.schedule_state(schedule.name, schedule.grace)
            fan_out = threading.Thread(
                target=FanOut(box.runtime, OWNER).run, args=(schedule, "2026-W33", None)
            )
            with points.installed({"scheduler.between_batches": held_up}):
                fan_out.start()
                assert held_up.reached.wait(30)
                later = clock.advance(timedelta(minutes=1))

                def renewed() -> object:
                    run = box.store.schedule_run_get("weekly-digest", "2026-W33")
                    return run is not None and run.renewed_at == later

                wait_until(renewed, what="a renewal at the clock's new instant")
                [held] = status_data(box, 3)["fan_outs"]
                assert (held["owner"], held["owner_live"]) == (OWNER, True), held
                held_up.release()
                fan_out.join(30)
            [run] = box.store.schedule_run_list("weekly-digest")
            assert (run.state, run.eligible_count) == ("done", 5), run
            assert status_data(box, 3)["fan_outs"] == []
    finally:
        held_up.release()
        box.close()


def test_an_operator_takes_a_gone_owners_run_over_at_once_audited(store_url):
    box = scheduled_box(store_url, customers=5, batch_size=2)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_half_way(box)
            clock.advance(timedelta(minutes=1))  # its lease has four minutes left
            with pytest.raises(InvalidState, match="running now"):
                box.run_schedule("weekly-digest", "2026-W33")
            taken = take_over(box)
        assert (taken.previous.owner, taken.previous.live) == (OWNER, False), taken
        assert (taken.fan_out.eligible, taken.fan_out.enqueued) == (5, 3), taken.fan_out
        assert digest_keys(box) == keys(range(1, 6))
        [run] = box.store.schedule_run_list("weekly-digest")
        assert (run.state, run.scans, run.eligible_count) == ("done", 1, 5), run
        assert take_overs(box) == [("ops-alice", "weekly-digest", "the store restarted under it")]
        [audit] = box.store.audit_search(AuditFilter(action="take-over"))
        assert audit.id == taken.audit_id and '"2026-W33"' in (audit.details or ""), audit
        assert OWNER in (audit.details or ""), audit
    finally:
        box.close()


def test_a_take_over_refuses_a_live_owners_run_and_changes_nothing(store_url):
    box = scheduled_box(store_url, customers=5, batch_size=2)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_half_way(box)
            clock.advance(timedelta(seconds=10))  # renewed 10 s ago: alive
            with pytest.raises(InvalidState, match="is alive"):
                take_over(box)
        [run] = box.store.schedule_run_list("weekly-digest")
        assert (run.state, run.owner) == ("running", OWNER), run
        assert take_overs(box) == []
        assert digest_keys(box) == keys([1, 2])
    finally:
        box.close()


def test_a_take_over_of_a_period_with_no_running_fan_out_is_refused(store_url):
    box = scheduled_box(store_url, customers=2)
    try:
        with FrozenClock(box, at=MONDAY_W33):
            with pytest.raises(InvalidState, match="no fan-out of 2026-W33 is running"):
                take_over(box)
            box.run_schedule("weekly-digest", "2026-W33")
            with pytest.raises(InvalidState, match="no fan-out of 2026-W33 is running"):
                take_over(box)
        assert take_overs(box) == []
    finally:
        box.close()


@dataclass
class Raced:
    taken: bool
    refusal: str
    owner_after: str | None
    owner_still_holds: bool  # the first owner's next extend found its run
    take_overs: int


def race_take_over(url: str) -> Raced:
    """The operator reads the run (its owner silent for a minute: gone), and before its write,
    the owner — slow, not dead — renews on its own connection."""
    box = scheduled_box(url, customers=5, batch_size=2)
    owner = open_store(url)  # the owner's process
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            die_half_way(box)
            clock.advance(timedelta(minutes=1))

            def owner_renews(_point: str) -> None:
                assert owner.schedule_run_renew("weekly-digest", "2026-W33", OWNER)

            taken, refusal = False, ""
            with points.installed({"schedule.take_over_before_write": owner_renews}):
                try:
                    take_over(box)
                    taken = True
                except InvalidState as exc:
                    refusal = str(exc)
            [run] = box.store.schedule_run_list("weekly-digest")
            holds = owner.schedule_run_extend("weekly-digest", "2026-W33", OWNER, LEASE, 0)
        return Raced(taken, refusal, run.owner, holds, len(take_overs(box)))
    finally:
        owner.close()
        box.close()


def test_a_take_over_changes_nothing_when_the_owner_renewed_after_it_was_read(store_url):
    raced = race_take_over(store_url)
    assert not raced.taken and "nothing was taken over" in raced.refusal, raced
    assert (raced.owner_after, raced.owner_still_holds, raced.take_overs) == (OWNER, True, 0)


def test_a_take_over_without_its_fence_takes_a_live_owners_run(store_url):
    with mutated("take-over-unfenced"):
        raced = race_take_over(store_url)
    assert raced.taken and raced.owner_after != OWNER, raced
    assert (raced.owner_still_holds, raced.take_overs) == (False, 1), raced
