"""Shared rate limits: every dispatcher on every host draws from the same buckets, on the
database's clock; waits spend no attempts; a provider's 429 pauses all of them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from oncebox import ConfigurationError, WorkerConfig
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.kernel import points
from oncebox.kernel.clock import monotonic
from oncebox.limits.rates import Limit
from oncebox.outbox.ratelimit import take
from oncebox.store.records import BucketState
from oncebox.testing import FrozenClock, MemoryProvider, drain
from support.outbox import enqueue_customers

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


def run_concurrently(dispatchers) -> int:
    sent: list[int] = []
    lock = threading.Lock()

    def one(dispatcher) -> None:
        result = dispatcher.run_once()
        with lock:
            sent.append(result.sent)

    threads = [threading.Thread(target=one, args=(d,)) for d in dispatchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return sum(sent)


def test_three_dispatchers_sharing_ten_per_second_never_exceed_the_bucket(store_url, mail_box):
    memory = MemoryProvider()
    box = mail_box(store_url, memory, limits=["10/s"], batch_size=8)
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, range(60))
        drain(box, dispatch=False)
        dispatchers = [box.dispatcher(name=f"d{i}") for i in range(3)]
        timeline: list[tuple[float, int]] = []  # (seconds since the start, messages sent)
        for step in range(8):
            timeline.append((step / 2, run_concurrently(dispatchers)))
            if step % 2 == 0:  # again at the same instant
                timeline.append((step / 2, run_concurrently(dispatchers)))
            clock.advance(timedelta(milliseconds=500))
    # a full bucket of 10 at once, nothing more at that instant, then the half second's refill
    assert [sent for _at, sent in timeline[:3]] == [10, 0, 5]
    total = 0
    for at, sent in timeline:
        total += sent
        assert total <= 10 + 10 * at, timeline  # never ahead of the bucket
    # nor far behind it: after a throttled round a dispatcher leases about what it was granted
    # (fewer rows given back unsent), so a few tokens can be left for the next step
    assert total >= 10 + 10 * 3.5 - 5, timeline
    rows = [
        r
        for c in range(60)
        for r in box.store.outbox_find_by_key(f"weekly-digest/customer-{c}/2026-W33")
    ]
    assert sum(r.state == "sent" for r in rows) == len(memory.sent) == total
    assert {r.attempt for r in rows if r.state == "pending"} == {0}  # waiting spent nothing


def test_an_idle_dispatcher_waits_for_its_next_due_message_not_for_the_poll(store_url, mail_box):
    """Rows a rate limit gave back fall due within a second; an idle dispatcher lane must wake
    for them rather than sleep its 5 s poll (a 10/s channel would send 10 per 5 s)."""
    box = mail_box(store_url, MemoryProvider(), limits=["10/s"])
    worker = box.worker(WorkerConfig())
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, range(30))
        drain(box, dispatch=False)
        dispatcher = box.dispatcher()
        first = dispatcher.run_once()
        assert (first.sent, first.waited) == (10, 20)  # the bucket's burst; the rest given back
        due_in = dispatcher.next_due_in()
        assert due_in is not None and 0 < due_in <= 1.0
        assert worker._idle_wait(dispatcher.next_due_in, 0) == pytest.approx(due_in)
        clock.advance(timedelta(seconds=due_in))
        second = dispatcher.run_once()
        # about as many rows leased as the bucket grants, not the 20 waiting: each row given
        # back unsent is a write, and a full batch per token would be 19 of them per message
        assert second.sent == 1 and second.leased <= 10
        for _ in range(5):  # 10/s: the remaining rows within a few seconds
            clock.advance(timedelta(seconds=1))
            dispatcher.run_once()
        assert dispatcher.next_due_in() is None  # nothing pending: the poll interval
    assert worker._idle_wait(dispatcher.next_due_in, 0) == worker.poll_interval == 5.0


@pytest.mark.slow
def test_a_rate_limited_worker_keeps_sending_at_its_rate_between_polls(store_url, mail_box):
    """The same, end to end: a worker whose poll is an hour still sends 25 messages through a
    10/s channel in a few seconds, each given-back batch sent as it falls due."""
    memory = MemoryProvider()
    box = mail_box(store_url, memory, limits=["10/s"])
    enqueue_customers(box, range(25))
    all_sent = threading.Event()

    def count(_name: str) -> None:
        if len(memory.sent) >= 25:
            all_sent.set()

    worker = box.worker(WorkerConfig(poll_interval=timedelta(hours=1)))
    with points.installed({"dispatcher.after_provider_accept_before_record": count}):
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert all_sent.wait(30), f"{len(memory.sent)} of 25 sent in 30 s (the poll: 1 h)"
        finally:
            worker.stop()
            thread.join(30)


def test_a_daily_limit_holds_across_the_per_second_refills(store_url, mail_box):
    box = mail_box(store_url, MemoryProvider(), limits=["100/s", "12/day"])
    with FrozenClock(box, at=T0) as clock:
        enqueue_customers(box, range(20))
        assert drain(box).dispatched.sent == 12
        clock.advance(timedelta(hours=1))
        assert drain(box).dispatched.sent == 0
        clock.advance(timedelta(hours=2))  # 12/day refills one every two hours
        assert drain(box).dispatched.sent == 1


def test_a_429_stops_every_dispatcher_until_retry_after(store_url, mail_box):
    with FakeEmailApi() as api:
        box = mail_box(store_url, api.url, batch_size=2)
        api.script("429:30")
        with FrozenClock(box, at=T0) as clock:
            enqueue_customers(box, range(6))
            drain(box, dispatch=False)
            dispatchers = [box.dispatcher(name=f"d{i}") for i in range(3)]
            throttled = dispatchers[0].run_once()
            assert throttled.throttled == 1
            calls = api.requests
            assert run_concurrently(dispatchers) == 0
            assert api.requests == calls  # nobody asked the provider during the pause
            clock.advance(timedelta(seconds=30))
            assert sum(run_concurrently(dispatchers) for _ in range(3)) == 6
        assert len(set(api.tokens())) == 6 == len(api.tokens())


def test_the_bucket_arithmetic():
    bucket = BucketState("10/s", 10.0, 10.0, 10.0, T0)
    after, grant = take([bucket], 25, T0, None)
    assert grant.granted == 10 and after[0].tokens == 0.0
    assert grant.retry_in == timedelta(seconds=0.1)
    after, grant = take(after, 25, T0 + timedelta(seconds=0.35), None)
    assert grant.granted == 3
    paused, grant = take(after, 5, T0 + timedelta(seconds=1), T0 + timedelta(seconds=31))
    assert (grant.granted, grant.retry_in) == (0, timedelta(seconds=30))
    assert paused == after  # a paused channel takes nothing


@pytest.mark.parametrize(
    ("text", "count", "seconds"),
    [
        ("14/s", 14, 1),
        ("600/min", 600, 60),
        ("50000/day", 50000, 86400),
        ("3/10s", 3, 10),
        ("5 / hour", 5, 3600),
    ],
)
def test_limits_parse(text, count, seconds):
    limit = Limit.parse(text)
    assert (limit.count, limit.period) == (count, timedelta(seconds=seconds))


@pytest.mark.parametrize(
    "text", ["", "10", "0/s", "ten/s", "10/fortnight", "-1/s", "10/ms", "10/0s"]
)
def test_bad_limits_are_refused(text):
    with pytest.raises(ConfigurationError):
        Limit.parse(text)


def test_a_taker_that_read_an_earlier_time_never_moves_the_bucket_back():
    """A taker whose transaction began before another's took the lock reads an earlier `now`
    than the bucket's `updated_at`: it must refill nothing, and leave the time where it was —
    written back, the next take would refill the same interval a second time."""
    t0 = datetime(2026, 8, 17, 9, tzinfo=UTC)
    bucket = BucketState("2/s", 2.0, 2.0, 1.0, t0 + timedelta(seconds=1))
    [after], grant = take([bucket], 1, t0, None)
    assert grant.granted == 1
    assert after.tokens == 0.0 and after.updated_at == t0 + timedelta(seconds=1)


@pytest.mark.postgres
def test_contending_takers_on_the_real_clock_never_get_more_than_the_bucket_refills(pg_url):
    """Eight threads take one token at a time from a 2/s bucket for two seconds, on the real
    clock: at most its capacity plus what two seconds refill (and one for the edges)."""
    from oncebox.store import open_store
    from oncebox.store.params import BucketSpec

    store = open_store(pg_url)
    store.rate_bucket_configure("email", [BucketSpec("2/s", 2.0, 2.0)])
    granted: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def taker() -> None:
        start.wait()
        began = monotonic()
        while monotonic() - began < 2.0:
            grant = store.rate_bucket_apply(
                "email", ["2/s"], lambda buckets, now, paused: take(buckets, 1, now, paused)
            )
            with lock:
                granted.append(grant.granted)

    began = monotonic()
    threads = [threading.Thread(target=taker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    elapsed = monotonic() - began
    store.close()
    assert len(granted) > 20, "the takers hardly contended"
    assert sum(granted) <= 2 + 2 * elapsed + 1, (sum(granted), round(elapsed, 2), len(granted))
