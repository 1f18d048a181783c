"""SQLite's write lock is taken in turns: a consumer that takes it again and again yields its
next turn to a writer that is waiting (an enqueue of the app, the worker's own lease keeper),
instead of winning every race against SQLite's sleeping busy handler."""

from __future__ import annotations

import threading

from oncebox.store import open_store
from support.waiting import wait_until


def test_a_greedy_writer_yields_its_next_turn_to_a_waiting_one(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'turns.db'}")
    turns = store._turns  # type: ignore[attr-defined]
    greedy, polite = store.connect(), store.connect()  # type: ignore[attr-defined]
    order: list[str] = []
    turns.begin(greedy, greedy=True)  # the consumer holds the lock

    def enqueue() -> None:
        turns.begin(polite)
        order.append("waiting writer")
        polite.execute("COMMIT")

    waiter = threading.Thread(target=enqueue)
    waiter.start()
    wait_until(lambda: turns.folder.is_dir() and any(turns.folder.iterdir()), what="a waiter")
    greedy.execute("COMMIT")
    turns.begin(greedy, greedy=True)  # its next transaction, at once
    order.append("greedy writer")
    greedy.execute("COMMIT")
    waiter.join(30)
    assert order == ["waiting writer", "greedy writer"]
    assert not turns.folder.exists()  # the waiter left no file, nor the folder, behind
    store.close()


def test_a_waiter_file_left_by_a_dead_process_is_cleared_not_yielded_to(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'turns.db'}")
    turns = store._turns  # type: ignore[attr-defined]
    turns.folder.mkdir()
    (turns.folder / "999999999.1.0").touch()  # no such pid
    conn = store.connect()  # type: ignore[attr-defined]
    turns.begin(conn, greedy=True)
    conn.execute("COMMIT")
    assert list(turns.folder.iterdir()) == []
    store.close()
