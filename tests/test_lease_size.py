"""The consumer's lease size adapts: it grows while batches come back full and finish quickly
in one transaction (a deep backlog of quick handlers, where each batch's fixed cost — lease,
claim, commit — is worth spreading), and halves back when the transaction budget cuts a batch
short (handlers too slow for that many in one transaction)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncebox import Box, ConsumerConfig
from oncebox.lanes.consumer import LeaseSize


def test_full_quick_batches_grow_the_lease_by_half_up_to_the_most():
    size = LeaseSize(base=10, most=40, budget=1.0)
    seen = []
    for _ in range(6):
        asked = size.now
        size.after(asked, leased=asked, transactions=1, seconds=0.01)
        seen.append(size.now)
    assert seen == [15, 22, 33, 40, 40, 40]


def test_a_batch_the_budget_cut_halves_the_lease_never_below_the_base():
    size = LeaseSize(base=10, most=80, budget=1.0)
    size.now = 64
    size.after(64, leased=64, transactions=2, seconds=1.2)
    assert size.now == 32
    for _ in range(3):
        size.after(size.now, leased=size.now, transactions=3, seconds=1.2)
    assert size.now == 10


@pytest.mark.parametrize(
    ("leased", "seconds"),
    [(7, 0.01), (10, 0.6)],
    ids=["a partial batch: the backlog is drained", "a slow batch: half the budget or more"],
)
def test_the_lease_stays_where_it_is(leased, seconds):
    size = LeaseSize(base=10, most=40, budget=1.0)
    size.after(10, leased=leased, transactions=1, seconds=seconds)
    assert size.now == 10


def test_max_batch_size_must_not_be_below_batch_size():
    with pytest.raises(ValueError, match="max_batch_size"):
        ConsumerConfig(batch_size=100, max_batch_size=50)


def _box_with_backlog(url: str, jobs: int) -> Box:
    box = Box(url)

    @box.task(name="noop")
    def noop(ctx: object, n: int) -> None:
        pass

    box.enqueue_many("noop", [{"n": n} for n in range(jobs)])
    return box


def test_a_consumer_on_a_deep_backlog_of_quick_jobs_leases_more_each_batch(store_url):
    box = _box_with_backlog(store_url, 500)
    consumer = box.consumer(ConsumerConfig(batch_size=10, transaction_budget=timedelta(seconds=30)))
    try:
        leased = [consumer.run_once().leased for _ in range(6)]
    finally:
        consumer.session.close()
        box.close()
    assert leased == [10, 15, 22, 33, 40, 40]  # up to 4 times batch_size by default


def test_a_consumer_whose_batches_the_budget_cuts_keeps_its_lease_at_the_base(store_url):
    box = _box_with_backlog(store_url, 100)
    consumer = box.consumer(
        ConsumerConfig(batch_size=10, transaction_budget=timedelta(microseconds=1))
    )
    try:
        leased = [consumer.run_once().leased for _ in range(4)]
    finally:
        consumer.session.close()
        box.close()
    assert leased == [10, 10, 10, 10]
