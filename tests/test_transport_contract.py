"""The transport contract: what every transport promises the consumer, run against each — the
built-in table queue on SQLite and PostgreSQL, and RabbitMQ, SQS and NATS JetStream with their
jobs recorded on PostgreSQL (tests/support/transports.py). Publish, receive under a hold no other
lane shares, keep the hold alive, acknowledge, give back with a delay, dead-letter, survive a lane
lost before its commit and an acknowledgement lost after it (a broker's redelivery ends as a
counted claim conflict), and keep a group's jobs in order."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from oncebox import Box, JobContext, Permanent, Retry, RetryLater
from oncebox.store.params import JobFilter
from oncebox.testing import FrozenClock
from support.brokers import AMQP_URL, NATS_URL, reachable, sqs_url
from support.db import create_effects, effects, record_effect, sql
from support.transports import NATS_ACK_WAIT_S, SQS_VISIBILITY_S, harness_for

T0 = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)
PERIOD = "2026-W50"
SECRET = "transport-contract-secret-0123"


@pytest.fixture(
    params=["table-sqlite", "table-postgres", "rabbitmq-postgres", "sqs-postgres", "nats-postgres"]
)
def lanes(request: pytest.FixtureRequest) -> Iterator[Any]:
    kind, dialect = request.param.split("-")
    url = request.getfixturevalue("sqlite_url" if dialect == "sqlite" else "pg_url")
    broker = {
        "table": lambda: None,
        "rabbitmq": lambda: reachable(AMQP_URL),
        "sqs": lambda: sqs_url(
            request.getfixturevalue("sqs_endpoint"), visibility=SQS_VISIBILITY_S
        ),
        "nats": lambda: f"{reachable(NATS_URL)}?ack_wait={NATS_ACK_WAIT_S}&wait=0.3",
    }[kind]()
    box = Box(url, secret=SECRET)
    create_effects(box)
    sql(box, "CREATE TABLE run_order (seq INTEGER PRIMARY KEY, leg TEXT)")
    try:
        with FrozenClock(box, at=T0) as clock, harness_for(kind, box, clock, broker) as harness:
            define_tasks(box, harness.queue)
            yield harness
    finally:
        box.close()


def define_tasks(box: Box, queue: str) -> None:
    @box.task(
        key="weekly-digest/customer-{customer_id}/{period}",
        queue=queue,
        retry=Retry(max_attempts=3, base_delay=timedelta(seconds=30)),
    )
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        if customer_id == 99:
            raise Permanent("customer 99 has no address")
        if customer_id == 98 and ctx.attempt == 1:
            raise RetryLater("the carrier's API is busy", delay=timedelta(minutes=1))
        record_effect(ctx, f"attempt {ctx.attempt}")

    @box.task(key="leg/{shipment}/{n}", queue=queue, group_by="shipment")
    def leg(ctx: JobContext, shipment: int, n: int) -> None:
        record_effect(ctx)
        seq = len(sql_in(ctx, "SELECT leg FROM run_order"))
        ph = "?" if ctx.dialect == "sqlite" else "%s"
        ctx.connection.execute(
            f"INSERT INTO run_order (seq, leg) VALUES ({ph}, {ph})", (seq, f"{shipment}/{n}")
        )


def sql_in(ctx: JobContext, statement: str) -> list[Any]:
    return list(ctx.connection.execute(statement).fetchall())


def publish(harness: Any, *customers: int) -> list[int]:
    ids = [
        harness.box.enqueue("weekly_digest", customer_id=c, period=PERIOD).job_id for c in customers
    ]
    harness.deliver()
    return ids


def run(harness: Any, lane: Any, rounds: int = 5) -> int:
    """Consumer rounds on `lane` until one finds nothing; how many deliveries they ran."""
    ran = 0
    for _ in range(rounds):
        got = lane.run_once().leased
        ran += got
        if not got:
            break
    return ran


def take(lane: Any, wanted: int) -> list[Any]:
    """Fetch until `wanted` deliveries are held (a broker's fetch returns what has arrived: a
    batch may come in parts), or a fetch finds nothing."""
    held: list[Any] = []
    while len(held) < wanted:
        got = lane.transport.fetch(wanted - len(held))
        if not got:
            break
        held += got
    return held


def job_state(harness: Any, job_id: int) -> str:
    job = harness.box.store.job_get(job_id)
    assert job is not None
    return str(job.state)


def test_a_published_job_is_received_under_a_hold_no_other_lane_shares(lanes):
    ids = publish(lanes, 1, 2, 3)
    first, second = lanes.lane(), lanes.lane()
    held = take(first, 3)
    assert sorted(d.job_id for d in held) == sorted(ids)
    assert {d.task for d in held} == {"weekly_digest"}
    assert second.transport.fetch(10) == []  # held by the first lane
    # given back unspent: received again, by whichever lane (a broker may already have pushed
    # some to the first lane's prefetch)
    first.transport.release(held, timedelta(0))
    lanes.deliver()
    again = take(second, 3)
    again += take(first, 3 - len(again))
    assert sorted(d.job_id for d in again) == sorted(ids)
    assert {d.attempt for d in again} == {1}


def test_a_hold_kept_alive_outlasts_its_first_lease(lanes):
    [job_id] = publish(lanes, 4)
    first, second = lanes.lane(), lanes.lane()
    [held] = take(first, 1)
    lanes.keep_alive(first, timedelta(hours=3))
    lanes.time_passes(timedelta(hours=1))  # past any first lease (SQLite's included)
    assert second.transport.fetch(10) == []
    assert job_state(lanes, job_id) in ("leased", "relayed")
    first.transport.release([held], timedelta(0))


def test_an_acknowledged_job_is_never_delivered_again(lanes):
    [job_id] = publish(lanes, 5)
    first = lanes.lane()
    assert run(lanes, first) == 1
    lanes.lose(first)  # whatever the lane still held goes back
    lanes.deliver()
    assert run(lanes, lanes.lane()) == 0
    assert job_state(lanes, job_id) == "done"
    assert effects(lanes.box) == [(f"weekly-digest/customer-5/{PERIOD}", "attempt 1")]


def test_a_job_given_back_with_a_delay_comes_back_after_it_its_attempt_counted(lanes):
    [job_id] = publish(lanes, 98)
    lane = lanes.lane()
    assert run(lanes, lane) == 1  # attempt 1: RetryLater, a minute
    lanes.time_passes(timedelta(seconds=30))
    lanes.deliver()
    assert run(lanes, lane) == 0  # not before its delay
    lanes.time_passes(timedelta(seconds=31))
    lanes.deliver()
    assert run(lanes, lane) == 1
    assert job_state(lanes, job_id) == "done"
    assert effects(lanes.box) == [(f"weekly-digest/customer-98/{PERIOD}", "attempt 2")]
    assert [a.outcome for a in lanes.box.store.job_attempt_list(job_id)] == ["failed"]


def test_a_dead_job_is_dead_lettered_with_its_error_and_not_delivered_again(lanes):
    [job_id] = publish(lanes, 99)
    lane = lanes.lane()
    assert run(lanes, lane) == 1
    [dead] = lanes.box.store.job_list(JobFilter(state="dead", limit=10))
    assert dead.id == job_id and "customer 99 has no address" in (dead.last_error or "")
    lanes.lose(lane)
    lanes.deliver()
    assert run(lanes, lanes.lane()) == 0
    assert lanes.box.store.counter_list()["jobs_dead"] == 1


def test_a_lane_lost_before_its_commit_leaves_the_job_to_another_which_runs_it_once(lanes):
    [job_id] = publish(lanes, 6)
    first = lanes.lane()
    assert len(take(first, 1)) == 1  # taken, never settled: the process dies
    lanes.lose(first)
    lanes.deliver()
    assert run(lanes, lanes.lane()) == 1
    assert job_state(lanes, job_id) == "done"
    assert len(effects(lanes.box)) == 1


def test_an_acknowledgement_lost_after_the_commit_ends_as_a_counted_claim_conflict(lanes):
    """On a broker the acknowledgement follows the commit, and a lane lost between the two
    leaves the message to be delivered again: the job's record absorbs it, counted. On the
    table queue the settlement is the acknowledgement: there is nothing to deliver again."""
    [job_id] = publish(lanes, 7)
    first = lanes.lane()
    settle_after = first.transport.after_commit
    first.transport.after_commit = lambda settlements: None  # committed; the ack never sent
    assert run(lanes, first, rounds=1) == 1
    first.transport.after_commit = settle_after
    lanes.lose(first)
    lanes.deliver()
    second = lanes.lane()
    assert run(lanes, second) == 0  # nothing runs twice
    assert job_state(lanes, job_id) == "done"
    assert len(effects(lanes.box)) == 1
    conflicts = lanes.box.store.counter_list().get("claim_conflicts", 0)
    assert conflicts == (1 if lanes.acknowledges_after_commit else 0)


def test_a_groups_jobs_run_in_the_order_enqueued_whichever_lane_takes_them(lanes):
    lanes.box.enqueue_many("leg", [{"shipment": s, "n": n} for n in range(3) for s in (1, 2)])
    lanes.deliver()
    one, two = lanes.lane(), lanes.lane()
    for _ in range(12):
        ran = one.run_once().leased + two.run_once().leased
        lanes.deliver()
        if not ran and not lanes.deliver():
            break
    order = [row[0] for row in sql(lanes.box, "SELECT leg FROM run_order ORDER BY seq")]
    assert sorted(order) == ["1/0", "1/1", "1/2", "2/0", "2/1", "2/2"]
    for shipment in ("1/", "2/"):
        mine = [leg for leg in order if leg.startswith(shipment)]
        assert mine == sorted(mine)
