"""SQLite's stand-in for NOTIFY: a commit by any connection or process, seen in the database
files, wakes every listener once (`SqliteStore.wait_for_work`)."""

from __future__ import annotations

import threading

from oncebox import Box
from oncebox.store.params import EVERY_KIND


def test_one_commit_wakes_every_listener_of_a_store_once(sqlite_url):
    watched, writer = Box(sqlite_url), Box(sqlite_url)  # the writer: another connection
    try:
        writer.task(key="w/{n}", name="w")(lambda ctx, n: None)
        writer.enqueue("w", n=1)  # after the watched store opened: both listeners must see it
        woken: list[frozenset[str]] = []
        listeners = [
            threading.Thread(target=lambda: woken.append(watched.store.wait_for_work(10.0)))
            for _ in range(2)
        ]
        for listener in listeners:
            listener.start()
        for listener in listeners:
            listener.join(15)
        assert woken == [EVERY_KIND, EVERY_KIND]  # SQLite cannot tell what the commit held
        assert watched.store.wait_for_work(10.0) == EVERY_KIND  # this thread's first look too
        assert watched.store.wait_for_work(0.2) == frozenset()  # seen once: no further commit
        writer.enqueue("w", n=2)
        assert watched.store.wait_for_work(10.0) == EVERY_KIND
    finally:
        watched.close()
        writer.close()
