"""Real concurrency on every store: threads and processes racing on the same keys."""

from __future__ import annotations

import multiprocessing
import queue
import threading

import pytest

from oncebox import Box, ConsumerConfig
from oncebox.testing import RedeliveringTransport
from support.apps import digest_box
from support.db import create_effects, effects, sql
from support.procs import broker_consumer, enqueue_and_work

SPAWN = multiprocessing.get_context("spawn")


@pytest.mark.slow
def test_eight_threads_and_four_processes_racing_on_the_same_keys_run_each_once_with_one_intent(
    store_url: str,
):
    setup = Box(store_url)
    create_effects(setup)
    setup.close()
    customers = list(range(25))
    barrier = SPAWN.Barrier(12)
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=enqueue_and_work, args=(store_url, customers, barrier, results, f"p{i}")
        )
        for i in range(4)
    ]
    threads = [
        threading.Thread(
            target=enqueue_and_work, args=(store_url, customers, barrier, results, f"t{i}")
        )
        for i in range(8)
    ]
    for worker in processes + threads:
        worker.start()
    for thread in threads:
        thread.join(120)
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    reports = [results.get(timeout=10) for _ in range(12)]

    box = Box(store_url)
    try:
        keys = [f"weekly-digest/customer-{c}/2026-W33" for c in customers]
        jobs = sql(
            box, "SELECT key, outcome, count(*) FROM oncebox_all_jobs GROUP BY 1, 2 ORDER BY 1, 2"
        )
        completed = sorted((key, n) for key, outcome, n in jobs if outcome == "completed")
        assert completed == sorted((k, 1) for k in keys), "more than one job ran for a key"
        # On PostgreSQL an enqueue whose intent check read a snapshot from before a completion
        # committed, and whose insert met that job's row leaving for the history, writes a
        # second job; its claim meets the intent and it ends a duplicate, running nothing
        # (docs/guarantees.md, row 2).
        others = [(key, outcome) for key, outcome, _n in jobs if outcome != "completed"]
        assert all(outcome == "duplicate" for _key, outcome in others), others
        rows = sum(n for _key, _outcome, n in jobs)
        assert box.store.intent_count() == len(keys)
        assert sorted(key for key, _who in effects(box)) == sorted(keys), "an effect ran twice"
        assert sum(r[1] for r in reports) == rows  # each job written by one enqueue
        assert (sum(r[2] for r in reports), sum(r[3] for r in reports)) == (25, rows - 25)
        counts = box.store.job_count_by_state().counts
        assert counts["done:completed"] == 25 and counts["done"] == rows
        counted = box.store.counter_list()  # twelve racers' counts, none lost to another's
        assert (counted["jobs_enqueued"], counted["enqueue_duplicates"]) == (rows, 12 * 25 - rows)
        assert counted["jobs_completed"] == 25
        assert counted.get("claim_conflicts", 0) == rows - 25
    finally:
        box.close()


def test_one_message_delivered_to_several_workers_at_once_completes_once(store_url: str):
    setup = digest_box(store_url)
    create_effects(setup)
    workers = 6
    barrier = threading.Barrier(workers)
    outcomes: queue.Queue[tuple[int, int]] = queue.Queue()
    broker = RedeliveringTransport(copies=workers, seed=3)
    for customer in range(10):
        broker.publish("weekly_digest", customer_id=customer, period="2026-W33")

    def consume(name: str) -> None:
        consumer = setup.consumer(ConsumerConfig(batch_size=3), transport=broker, name=name)
        try:
            barrier.wait(30)
            completed = duplicates = 0
            while True:
                result = consumer.run_once()
                completed += result.completed
                duplicates += result.duplicates
                if not result.leased:
                    break
            outcomes.put((completed, duplicates))
        finally:
            consumer.session.close()

    # each worker grabs only a few deliveries at a time, so copies of one message are in flight
    # in different workers' transactions at the same moment
    threads = [threading.Thread(target=consume, args=(f"w{i}",)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    totals = [outcomes.get_nowait() for _ in range(workers)]
    try:
        assert sum(c for c, _d in totals) == 10
        assert sum(d for _c, d in totals) == 10 * (workers - 1)
        assert len(effects(setup)) == 10
        assert sorted(o for _m, o in broker.acks).count("completed") == 10
    finally:
        setup.close()


@pytest.mark.slow
def test_processes_consuming_the_same_messages_at_once_complete_each_once(store_url: str):
    setup = Box(store_url)
    create_effects(setup)
    setup.close()
    deliveries = [("weekly_digest", str(c)) for c in range(30)]
    barrier = SPAWN.Barrier(4)
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(target=broker_consumer, args=(store_url, deliveries, barrier, results))
        for _ in range(4)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    reports = [results.get(timeout=10) for _ in range(4)]
    assert sum(r[1] for r in reports) == 30
    assert sum(r[2] for r in reports) == 90
    box = Box(store_url)
    try:
        assert len(effects(box)) == 30
        assert box.store.intent_count() == 30
        counted = box.store.counter_list()  # four processes' settlements, none lost
        assert (counted["jobs_completed"], counted["claim_conflicts"]) == (30, 90)
    finally:
        box.close()
