"""Workers as the store knows them, on every store: each live worker announces what it serves
and refreshes that while it runs; a stopped or silent one is not live; one not seen for a day
is forgotten."""

from __future__ import annotations

from datetime import timedelta

from oncebox.store.params import WorkerBeat
from oncebox.store.protocol import Store
from oncebox.store.records import WorkerRow
from support.contract import T0, advance

BEAT = WorkerBeat("h1:10:w1", "h1", 10, ("digest",), ("default",), ("email",))
LIVE = timedelta(seconds=30)


def test_worker_beat_announces_a_worker_and_refreshes_what_it_serves(store: Store):
    store.worker_beat(BEAT)
    assert store.worker_list(LIVE) == [
        WorkerRow("h1:10:w1", "h1", 10, ("digest",), ("default",), ("email",), T0, T0, None, True)
    ]
    later = advance(store, timedelta(seconds=20))
    store.worker_beat(WorkerBeat("h1:10:w1", "h1", 10, ("digest", "expire"), ("default",), ()))
    [worker] = store.worker_list(LIVE)
    assert (worker.tasks, worker.channels) == (("digest", "expire"), ())
    assert (worker.started_at, worker.seen_at, worker.live) == (T0, later, True)


def test_worker_list_says_a_worker_not_seen_within_the_window_is_not_live(store: Store):
    store.worker_beat(BEAT)
    advance(store, LIVE + timedelta(seconds=1))
    [worker] = store.worker_list(LIVE)
    assert (worker.name, worker.seen_at, worker.live) == ("h1:10:w1", T0, False)
    assert store.worker_list(timedelta(minutes=5))[0].live is True


def test_worker_stop_marks_a_worker_stopped_until_it_beats_again(store: Store):
    store.worker_beat(BEAT)
    stopped_at = advance(store, timedelta(seconds=5))
    store.worker_stop("h1:10:w1")
    [worker] = store.worker_list(LIVE)
    assert (worker.stopped_at, worker.seen_at, worker.live) == (stopped_at, stopped_at, False)
    store.worker_stop("unknown")  # nothing to stop: nothing written
    assert [w.name for w in store.worker_list(LIVE)] == ["h1:10:w1"]
    store.worker_beat(BEAT)  # restarted under the same name
    [again] = store.worker_list(LIVE)
    assert (again.stopped_at, again.live) == (None, True)


def test_a_worker_not_seen_for_a_day_is_forgotten_at_the_next_beat(store: Store):
    store.worker_beat(BEAT)
    advance(store, timedelta(days=1, seconds=1))
    store.worker_beat(WorkerBeat("h2:20:w1", "h2", 20, ("digest",), ("default",), ()))
    assert [(w.name, w.live) for w in store.worker_list(LIVE)] == [("h2:20:w1", True)]
