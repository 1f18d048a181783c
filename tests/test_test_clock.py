"""A test clock can never stall a real deployment: a frozen or offset setting names its owner and
lapses soon after the owner dies; a worker refuses a live one that another process holds (one
line naming the fix), `status` shows it first, and `oncebox clock reset` ends it at once.

The run these tests stand for: `oncebox demo` SIGKILLed on a Monday morning while it held the
clock at its simulated Monday and its dispatcher held a lease — before, every later worker ran on
frozen time, the lease never expired, and `oncebox worker --until-idle` exited 0 with digests
undelivered and no reason shown."""

from __future__ import annotations

import email
import json
import multiprocessing
import signal
import threading
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import Box, ClockHeld, WorkerConfig
from oncebox.examples.logistics.app import connect
from oncebox.examples.logistics.seed import is_active
from oncebox.kernel.clock import ClockSetting, real_now
from oncebox.testing import FrozenClock
from support.procs import demo_and_die, hold_clock_and_die
from support.waiting import wait_until
from test_cli import assert_one_line_error, oncebox

SPAWN = multiprocessing.get_context("spawn")
MONDAY = datetime(2026, 8, 17, 9, tzinfo=UTC)


def noop_box(url: str) -> Box:
    box = Box(url)

    @box.task(key="noop/{n}")
    def noop(ctx, n: int) -> None:
        pass

    return box


def test_a_test_clock_whose_owner_died_lapses_by_itself(store_url):
    box = noop_box(store_url)
    held = SPAWN.Event()
    owner = SPAWN.Process(target=hold_clock_and_die, args=(store_url, 1.0, held))
    owner.start()
    owner.join(60)
    assert owner.exitcode == -signal.SIGKILL and held.is_set()
    assert box.store.clock_get().frozen_at is not None  # left behind, as the owner died
    wait_until(lambda: box.store.clock_get().is_real, what="the dead owner's clock to lapse")
    assert abs(box.store.clock_now() - real_now()) < timedelta(minutes=5)
    assert box.work(until_idle=True).consumed.leased == 0  # not refused: it is real time
    box.close()


def test_a_worker_refuses_a_test_clock_another_process_holds_unless_told_it_is_simulated(
    store_url,
):
    box = noop_box(store_url)
    box.store.clock_set(ClockSetting(frozen_at=MONDAY, owner="elsewhere:1"))
    box.enqueue("noop", n=1)
    with pytest.raises(ClockHeld, match="oncebox clock reset"):
        box.work(until_idle=True)
    assert box.work(config=WorkerConfig(until_idle=True, simulated_time=True)).consumed.completed
    box.close()


def test_a_worker_in_the_process_that_froze_the_clock_runs_on_it(store_url):
    box = noop_box(store_url)
    with FrozenClock(box, at=MONDAY):
        box.enqueue("noop", n=1)
        assert box.work(until_idle=True).consumed.completed == 1
        assert box.store.clock_get().expires_at is not None  # held through a lease
    assert box.store.clock_get().is_real
    box.close()


def test_a_running_worker_stops_when_another_process_freezes_the_clock(store_url, monkeypatch):
    from oncebox.lanes import worker as worker_module

    monkeypatch.setattr(worker_module, "GUARD_EVERY", 0.05)
    box = noop_box(store_url)
    running = box.worker()
    result: list[BaseException] = []

    def run() -> None:
        try:
            running.run()
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    box.store.clock_set(ClockSetting(frozen_at=MONDAY, owner="a-test-elsewhere:7"))
    thread.join(60)
    assert not thread.is_alive()
    assert len(result) == 1 and isinstance(result[0], ClockHeld), result
    box.close()


def test_clock_show_reset_and_status_name_a_held_clock(tmp_path):
    url = f"sqlite:///{tmp_path / 'held.db'}"
    box = noop_box(url)
    expires = real_now() + timedelta(hours=1)
    box.store.clock_set(ClockSetting(frozen_at=MONDAY, owner="ci-host:4242", expires_at=expires))
    box.close()

    shown = oncebox("clock", "show", "--db", url, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert (data["mode"], data["owner"], data["frozen_at"]) == (
        "frozen",
        "ci-host:4242",
        "2026-08-17T09:00:00Z",
    )
    status = oncebox("status", "--db", url)
    assert status.stdout.startswith(
        "CLOCK      frozen at 2026-08-17T09:00:00+00:00 by ci-host:4242"
    )
    assert "oncebox clock reset" in status.stdout.splitlines()[0]
    assert json.loads(oncebox("status", "--db", url, "--json").stdout)["clock"]["mode"] == "frozen"

    assert_one_line_error(oncebox("clock", "reset", "--db", url), 2, "--reason")
    reset = oncebox("clock", "reset", "--db", url, "--reason", "the test run was killed")
    assert reset.returncode == 0 and "clock reset to real time" in reset.stdout, reset.stderr
    assert json.loads(oncebox("clock", "show", "--db", url, "--json").stdout)["mode"] == "real"
    assert not oncebox("status", "--db", url).stdout.startswith("CLOCK")
    audit = json.loads(oncebox("audit", "list", "--db", url, "--json").stdout)
    assert [(a["action"], a["reason"]) for a in audit] == [
        ("clock-reset", "the test run was killed")
    ]
    assert "ci-host:4242" in audit[0]["details"]["was"]


@pytest.mark.slow
def test_a_demo_killed_mid_dispatch_leaves_nothing_eligible_lost_for_the_next_worker(tmp_path):
    db, outbox = f"sqlite:///{tmp_path / 'demo.db'}", tmp_path / "outbox"
    outbox.mkdir()
    killed = SPAWN.Process(target=demo_and_die, args=(db, str(outbox), "dispatcher.after_lease"))
    killed.start()
    killed.join(120)
    assert killed.exitcode == -signal.SIGKILL
    worker = ["worker", "--app", "support.cli_freight", "--db", db, "--email", f"file://{outbox}"]

    refused = oncebox(*worker, "--until-idle")
    assert_one_line_error(refused, 1, "frozen at", "oncebox clock reset")
    assert oncebox("status", "--db", db).stdout.startswith("CLOCK")
    reset = oncebox("clock", "reset", "--db", db, "--reason", "the demo was killed")
    assert reset.returncode == 0, reset.stderr

    drained = oncebox(*worker, "--until-idle")
    assert drained.returncode == 0, drained.stderr
    box = Box(db)
    conn = connect(box)
    try:
        customers = [row[0] for row in conn.execute("SELECT id FROM freight_customers")]
        states = dict(
            conn.execute(
                "SELECT intent_key, state FROM oncebox_outbox "
                "WHERE intent_key LIKE 'weekly-digest/%'"
            ).fetchall()
        )
        dead_jobs = {
            row[0] for row in conn.execute("SELECT key FROM oncebox_all_jobs WHERE state = 'dead'")
        }
    finally:
        conn.close()
        box.close()
    eligible = {c for c in customers if is_active(c)}
    # the demo's week, and any week the next worker's scheduler caught up with since (on the real
    # clock, a Monday's fire after the demo's): each period complete on its own
    periods = sorted({key.rsplit("/", 1)[1] for key in states})
    assert periods
    for period in periods:
        dead = {key for key in dead_jobs if key.endswith(f"/{period}")}
        unsettled = {
            c
            for c in eligible
            if states.get(f"weekly-digest/customer-{c}/{period}") != "sent"
            and f"weekly-digest/customer-{c}/{period}" not in dead
        }
        assert unsettled == set(), (
            f"{period}: eligible customers with no digest and no visible state: {unsettled}"
        )
        digests = sum(
            1 for key, state in states.items() if key.endswith(f"/{period}") and state == "sent"
        )
        assert digests == len(eligible) - len(dead) and digests > 0, period
    tokens = [
        email.message_from_bytes(path.read_bytes())["X-Oncebox-Token"]
        for path in outbox.glob("*.eml")
    ]
    assert len(tokens) == len(set(tokens)), "a digest was delivered twice"
