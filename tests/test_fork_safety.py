"""A Box created before a fork (gunicorn's --preload, a multiprocessing pool) is safe to use in
the children: a child opens connections of its own instead of sharing the parent's sockets —
two processes writing one connection's protocol stream corrupt both — and leaves the parent's
working."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from conftest import TEST_SECRET
from oncebox import Box
from oncebox.store.postgres import PostgresStore
from oncebox.store.sqlite import SqliteStore
from support.apps import digest_box


def in_child(run: Callable[[], object]) -> dict[str, object]:
    """Run `run()` in a forked child; its JSON answer (or the error it met)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, and leave without running the parent's clean-ups
        os.close(read_end)
        try:
            answer = {"ok": run()}
        except BaseException as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as answer_pipe:
        reply: dict[str, object] = json.loads(answer_pipe.read())
    os.waitpid(pid, 0)
    return reply


def connection_identity(box: Box) -> object:
    """Which connection the box's own statements go through (the server's process id on
    PostgreSQL, the connection object on SQLite)."""
    store = box.store
    if isinstance(store, PostgresStore):
        with store._connection() as conn:
            return conn.info.backend_pid
    assert isinstance(store, SqliteStore)
    return id(store._conn())


@pytest.fixture
def one_connection_box(store_url: str):
    # one pooled connection on PostgreSQL: a child that inherited the pool would get exactly it
    url = store_url + ("?pool_min=1&pool_max=1" if store_url.startswith("postgresql") else "")
    box = digest_box(url, secret=TEST_SECRET)
    try:
        yield box
    finally:
        box.close()


def test_a_forked_child_uses_connections_of_its_own_and_leaves_the_parents_working(
    one_connection_box: Box,
):
    box = one_connection_box
    box.enqueue("weekly_digest", customer_id=1, period="2026-W33")  # connections open pre-fork
    parent = connection_identity(box)

    def child() -> list[object]:
        created = box.enqueue("weekly_digest", customer_id=2, period="2026-W33").created
        return [connection_identity(box), created]

    answer = in_child(child)
    assert "error" not in answer, answer
    reported = answer["ok"]
    assert isinstance(reported, list)
    child_connection, created = reported
    assert created is True and child_connection != parent
    # the parent's connection still works: the child neither used nor closed it
    assert connection_identity(box) == parent
    assert box.enqueue("weekly_digest", customer_id=3, period="2026-W33").created
