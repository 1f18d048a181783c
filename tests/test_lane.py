"""The background lanes' shared loop: an outage is a pause, a damaged or vanished database is
the end — retrying it would only log the same traceback every interval while nothing works."""

from __future__ import annotations

import threading

import pytest

from oncebox.kernel.errors import SchemaError, StoreReplaced, StoreUnavailable
from oncebox.lanes.lane import run_forever


@pytest.mark.parametrize(
    "fatal",
    [SchemaError("the oncebox tables are missing"), StoreReplaced("the file was deleted")],
)
def test_a_damaged_or_vanished_database_ends_the_loop_for_its_caller_to_stop_on(fatal):
    calls: list[int] = []

    def once() -> bool:
        calls.append(1)
        raise fatal

    with pytest.raises(type(fatal)):
        run_forever("lane", once, threading.Event(), interval=0.0)
    assert calls == [1]


def test_an_outage_is_retried_until_the_store_answers():
    stop = threading.Event()
    answers = iter([StoreUnavailable("down"), StoreUnavailable("down"), None])

    def once() -> bool:
        answer = next(answers)
        if answer is not None:
            raise answer
        stop.set()
        return False

    run_forever("lane", once, stop, interval=0.0, max_backoff=0.0)
    assert stop.is_set()
