"""oncebox behind a real PgBouncer in transaction pooling (the web tier's usual pooler): a web
process's Box and the app's own SQLAlchemy sessions enqueue through it with psycopg's prepared
statements off; a worker pointed at it is told to connect straight to PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from conftest import TEST_SECRET
from oncebox import Box, JobContext
from oncebox.kernel.errors import ConfigurationError
from oncebox.testing import drain
from support.pgbouncer import pgbouncer

pytestmark = pytest.mark.postgres


class RequestFailed(Exception):
    pass


@pytest.fixture
def bouncer(pg_url: str) -> Iterator[str]:
    """One server connection for all its clients: two clients' statements meet on it."""
    with pgbouncer(pg_url, pool_size=1) as url:
        yield url


def declare(box: Box) -> Box:
    @box.task(key="welcome/{customer}")
    def welcome(ctx: JobContext, customer: int) -> None:
        pass

    return box


def web_boxes(url: str) -> list[Box]:
    """Two web processes' Boxes, each with a pool of one connection: two clients of PgBouncer."""
    return [declare(Box(f"{url}&pool_max=1" if "?" in url else f"{url}?pool_max=1")) for _ in "ab"]


def enqueue_alternately(boxes: list[Box], count: int) -> int:
    """More than psycopg's five executions before it prepares a statement, from both clients."""
    created = 0
    for n in range(count):
        created += boxes[n % 2].enqueue("welcome", customer=n).created
    return created


def test_web_boxes_behind_pgbouncer_enqueue_with_prepared_statements_off(pg_url, bouncer):
    boxes = web_boxes(f"{bouncer}?prepare_threshold=none")
    try:
        assert enqueue_alternately(boxes, 20) == 20
    finally:
        for box in boxes:
            box.close()
    worker = declare(Box(pg_url, secret=TEST_SECRET))  # the worker: straight to PostgreSQL
    try:
        assert drain(worker).completed == 20
    finally:
        worker.close()


def test_with_prepared_statements_on_the_pooler_mixes_them_up_and_says_what_to_add(bouncer):
    """What the option is for: the same statement prepared by two clients on PgBouncer's one
    server connection. The error names the fix instead of a driver's puzzle."""
    boxes = web_boxes(bouncer)
    try:
        with pytest.raises(ConfigurationError, match="add prepare_threshold=none to the URL"):
            enqueue_alternately(boxes, 20)
    finally:
        for box in boxes:
            box.close()


def test_an_app_session_behind_pgbouncer_commits_and_rolls_back_its_job(pg_url, bouncer):
    box = declare(Box(f"{bouncer}?prepare_threshold=none", secret=TEST_SECRET))
    engine = sa.create_engine(
        bouncer.replace("postgresql://", "postgresql+psycopg://", 1),
        connect_args={"prepare_threshold": None},
    )
    try:
        for customer in range(12):
            with suppress(RequestFailed), Session(engine) as session, session.begin():
                box.enqueue("welcome", customer=customer, connection=session)
                if customer % 2:
                    raise RequestFailed  # after its enqueue: the transaction rolls back
        kept = [n for n in range(12) if box.store.job_find_by_key(f"welcome/{n}")]
        assert kept == list(range(0, 12, 2))
    finally:
        engine.dispose()
        box.close()


def test_a_worker_pointed_at_pgbouncer_is_told_to_connect_straight_to_postgresql(bouncer):
    box = declare(Box(f"{bouncer}?prepare_threshold=none", secret=TEST_SECRET))
    try:
        box.enqueue("welcome", customer=1)
        with pytest.raises(ConfigurationError, match="Point workers straight at PostgreSQL"):
            drain(box)
    finally:
        box.close()
