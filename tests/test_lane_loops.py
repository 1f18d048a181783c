"""The loops the lane shape added: the consumer's and the delivery rescuer's `run_forever`, and
the configs of the lanes that took loose settings before (the older calls still mean what they
meant)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from oncebox import Box, ConsumerConfig
from oncebox.kernel import points
from oncebox.lanes.delivery_rescuer import DeliveryRescuer, DeliveryRescuerConfig
from oncebox.lanes.resolver import AmbiguityResolver, ResolverConfig
from oncebox.lanes.ticker import ScheduleTicker, TickerConfig
from support.rows import job_row


class Stop(threading.Event):
    """A stop event that records each wait of the loop (its pacing), without sleeping: a wait
    made while the event is clear sets it (the loop then ends after one pause)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[object] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.set()
        return True


def quick_task(box: Box) -> None:
    @box.task(key="quick/{n}")
    def quick(ctx, n: int) -> None:
        pass


def test_a_consumer_run_forever_runs_again_at_once_after_a_round_that_leased(box: Box):
    quick_task(box)
    ids = [box.enqueue("quick", n=n).job_id for n in range(3)]
    # two rounds lease (two jobs, then one: not a full batch), the third finds nothing
    config = ConsumerConfig(batch_size=2, max_batch_size=2, poll_interval=timedelta(seconds=7))
    consumer = box.consumer(config)
    stop = Stop()
    seen: list[object] = []
    stop.waits = seen  # the pauses, in order with the rounds
    try:
        with points.installed(
            {"consumer.leased": seen.append, "consumer.found_nothing": seen.append}
        ):
            consumer.run_forever(stop)
    finally:
        consumer.close()
    assert seen == ["consumer.leased", "consumer.leased", "consumer.found_nothing", 7.0]
    assert [job_row(box, i).state for i in ids] == ["done"] * 3


def test_a_consumer_run_forever_stopped_mid_batch_gives_back_what_it_has_not_started(box: Box):
    quick_task(box)
    ids = [box.enqueue("quick", n=n).job_id for n in range(3)]
    # each transaction admits one handler: the batch takes three
    config = ConsumerConfig(batch_size=3, max_batch_size=3, transaction_budget=timedelta(0))
    consumer = box.consumer(config)
    stop = Stop()
    try:
        with points.installed({"consumer.committed": lambda _name: stop.set()}):
            consumer.run_forever(stop)
    finally:
        consumer.close()
    rows = [job_row(box, i) for i in ids]
    assert [(r.state, r.attempt) for r in rows] == [("done", 1), ("ready", 0), ("ready", 0)]
    assert stop.waits == []


def test_a_delivery_rescuer_run_forever_waits_its_interval_after_a_round_with_nothing(box: Box):
    config = DeliveryRescuerConfig(interval=timedelta(seconds=9))
    rescuer = DeliveryRescuer(box.store, box.channels, box.metrics, config=config)
    stop = Stop()
    rescuer.run_forever(stop)
    assert stop.waits == [9.0]


def test_the_lanes_older_settings_build_their_config_and_both_at_once_are_refused(box: Box):
    resolver = AmbiguityResolver(box.store, box.channels, batch_size=7, interval=30.0)
    assert resolver.config == ResolverConfig(batch_size=7, interval=timedelta(seconds=30))
    assert (resolver.batch_size, resolver.interval) == (7, 30.0)
    assert AmbiguityResolver(box.store, box.channels).config == ResolverConfig()
    rescuer = DeliveryRescuer(box.store, box.channels, box.metrics, 20)
    assert rescuer.config == DeliveryRescuerConfig(batch_size=20)
    ticker = ScheduleTicker(box.runtime, {}, "t", timedelta(seconds=4))
    assert ticker.config == TickerConfig(timedelta(seconds=4))
    with pytest.raises(TypeError, match="batch_size"):
        AmbiguityResolver(box.store, box.channels, batch_size=7, config=ResolverConfig())
