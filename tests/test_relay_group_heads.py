"""A group of a broker-held queue has one head in the broker at a time (PostgreSQL, the relay
trigger): whichever job of the group was decided first under the group's lock, however the ids
fell. A multi-row enqueue takes its rows' ids as it inserts them and decides their publishes
when its statement ends; in between, a single enqueue of the same group with a higher id used
to decide alone, miss the batch's uncommitted row, and publish — and then the batch published
its own job too: two heads, the later first. The race runs on real transactions, ordered by the
batch's lock wait as `pg_stat_activity` shows it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from oncebox import Box, JobContext
from oncebox.chaos.mutations import mutated
from oncebox.store.params import RelayedFinish
from support.brokers import AMQP_URL
from support.contract import opened_session
from support.db import lock_waits
from support.waiting import wait_until

QUEUE = "legs"
T0 = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)


def legs_box(url: str) -> Box:
    """A box whose queue a broker holds (never reached here: the relay's publishes are only
    written, which is where a group's head is decided)."""
    box = Box(url, secret="group-heads-secret-0123456789")
    box.queue(QUEUE, broker=AMQP_URL)

    @box.task(key="leg/{shipment}/{n}", queue=QUEUE, group_by="shipment")
    def leg(ctx: JobContext, shipment: int, n: int) -> None:
        pass

    return box


def heads(url: str, group: str) -> list[str]:
    """The keys of the group's jobs whose current attempt's publish is written (so in the
    broker, or on its way there), in the order those publishes were decided."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT j.key FROM oncebox_all_jobs j"
            " JOIN oncebox_outbox o ON o.key = '~relay/' || j.id || '/' || (j.attempt + 1)"
            " WHERE j.queue = %s AND j.group_key = %s AND j.state = 'relayed' ORDER BY o.id",
            (QUEUE, group),
        ).fetchall()
    return [str(key) for (key,) in rows]


def race_a_batch_held_by_a_key(url: str) -> list[str]:
    """A batch [leg 1/1, leg 2/0] inserts leg 1/1 (its id taken), then waits on leg 2/0's key,
    which another transaction holds uncommitted; meanwhile leg 1/2 — shipment 1 too, a higher
    id — is enqueued alone and commits; then the holder rolls back and the batch ends. Returns
    shipment 1's heads."""
    box = legs_box(url)
    holder = psycopg.connect(url)
    try:
        box.enqueue("leg", connection=holder, shipment=2, n=0)
        failed: list[BaseException] = []

        def batch() -> None:
            try:
                box.enqueue_many("leg", [{"shipment": 1, "n": 1}, {"shipment": 2, "n": 0}])
            except BaseException as exc:  # shown by the assertion below
                failed.append(exc)

        batcher = threading.Thread(target=batch)
        batcher.start()
        wait_until(
            lambda: lock_waits(url),
            what="the batch's insert of leg/2/0 to wait for the holder's row",
        )
        box.enqueue("leg", shipment=1, n=2)
        holder.rollback()
        batcher.join(timeout=30)
        assert not batcher.is_alive() and not failed, failed
        return heads(url, "1")
    finally:
        holder.close()
        box.close()


@pytest.mark.postgres
def test_a_group_has_one_head_when_a_batch_decides_after_a_later_enqueue(pg_url: str):
    assert race_a_batch_held_by_a_key(pg_url) == ["leg/1/2"]  # decided first: the head
    box = legs_box(pg_url)
    try:
        box.cancel("leg/1/2", reason="the head ends")
        assert heads(pg_url, "1") == ["leg/1/1"]  # the batch's job, next
    finally:
        box.close()


@pytest.mark.postgres
def test_a_group_has_two_heads_without_its_fence(pg_url: str):
    with mutated("no-group-head-fence"):
        assert race_a_batch_held_by_a_key(pg_url) == ["leg/1/2", "leg/1/1"]


@pytest.mark.postgres
def test_a_replayed_older_job_waits_for_the_head_its_group_has(pg_url: str):
    """Leg 1/0 dies, so leg 1/1 becomes the head; leg 1/0, replayed and handed to the relay
    again, has the lower id but must not join it in the broker: it is next."""
    box = legs_box(pg_url)
    try:
        first = box.enqueue("leg", shipment=1, n=0).job_id
        box.enqueue("leg", shipment=1, n=1)
        assert first is not None and heads(pg_url, "1") == ["leg/1/0"]
        finish = RelayedFinish(
            first, 1, "dead", None, timedelta(0), "the depot refused it", "w", T0
        )
        assert box.store.job_bury_relayed([finish]) == {first}
        assert heads(pg_url, "1") == ["leg/1/1"]
        box.replay("leg/1/0", reason="the depot takes it now")
        assert box.store.job_relay_adopt([QUEUE], ["leg"], 10) == 1
        assert heads(pg_url, "1") == ["leg/1/1"]
        box.cancel("leg/1/1", reason="the head ends")
        assert heads(pg_url, "1") == ["leg/1/0"]
    finally:
        box.close()


def retry_the_head(box: Box, key: str) -> None:
    """The head's delivery failed: the consumer settles it relayed at its next attempt (as
    `job_settle_relayed` does after a failed handler), which the relay must publish."""
    [job] = [j for j in box.store.job_find_by_key(key) if j.state == "relayed"]
    finish = RelayedFinish(job.id, job.attempt + 1, "ready", None, timedelta(0), "boom", "w", T0)
    with opened_session(box.store) as session, session.transaction() as tx:
        assert tx.job_settle_relayed([finish]) == {job.id}


@pytest.mark.postgres
def test_a_head_retried_while_a_replayed_older_job_waits_is_published_again(pg_url: str):
    """The head keeps its group while it retries, whatever older job waits behind it: its next
    attempt is published, and the older job only once the head ends — never neither."""
    box = legs_box(pg_url)
    try:
        first = box.enqueue("leg", shipment=1, n=0).job_id
        box.enqueue("leg", shipment=1, n=1)
        assert first is not None
        buried = RelayedFinish(first, 1, "dead", None, timedelta(0), "refused", "w", T0)
        assert box.store.job_bury_relayed([buried]) == {first}
        box.replay("leg/1/0", reason="the depot takes it now")
        assert box.store.job_relay_adopt([QUEUE], ["leg"], 10) == 1
        assert heads(pg_url, "1") == ["leg/1/1"]
        retry_the_head(box, "leg/1/1")
        assert heads(pg_url, "1") == ["leg/1/1"]  # its second attempt, published
        box.cancel("leg/1/1", reason="the head ends")
        assert heads(pg_url, "1") == ["leg/1/0"]
    finally:
        box.close()


@pytest.mark.postgres
def test_a_head_retried_while_the_batchs_older_job_waits_is_published_again(pg_url: str):
    assert race_a_batch_held_by_a_key(pg_url) == ["leg/1/2"]
    box = legs_box(pg_url)
    try:
        retry_the_head(box, "leg/1/2")
        assert heads(pg_url, "1") == ["leg/1/2"]
        box.cancel("leg/1/2", reason="the head ends")
        assert heads(pg_url, "1") == ["leg/1/1"]
    finally:
        box.close()
