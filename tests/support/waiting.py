"""Waiting for something another thread, process or server does: one helper, no ad-hoc loops.

Most synchronisation in the suite is a signal (an `Event`, a named point, a barrier). Some things
have no signal to wait on — a server backend ending, a session showing up in
`pg_stat_activity`, a lock wait starting — and there a test polls. `wait_until` is the one poll:
a short interval (the interval is not what the test waits for, the condition is), a generous
timeout (CI is a slow, loaded machine), and a failure that says what never happened and what was
seen last.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = 30.0  # seconds: generous, a loaded 2-core CI machine is slow
INTERVAL = 0.01  # seconds between two looks; short, so a test does not wait longer than needed


def wait_until(
    condition: Callable[[], T], timeout: float = TIMEOUT, what: str = "the condition"
) -> T:
    """Call `condition()` until it returns something truthy; return that value.

    After `timeout` seconds without a truthy value, fail with `what` (say what was awaited,
    e.g. "the worker's LISTEN") and the last value `condition()` returned."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()  # never set: its `wait` is the pause between two looks
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}; last seen: {value!r}"
            )
        pause.wait(INTERVAL)
