"""`support.waiting.wait_until`, the suite's one poll: returns what it waited for, or fails
saying what never happened and what it saw last."""

from __future__ import annotations

import itertools

import pytest

from support.waiting import wait_until


def test_wait_until_returns_the_first_truthy_value_the_condition_gave():
    answers = iter([None, 0, [], ["row"], ["later"]])
    assert wait_until(lambda: next(answers), timeout=5, what="a row") == ["row"]
    assert next(answers) == ["later"]  # it stopped asking once it had an answer


def test_wait_until_fails_naming_what_it_waited_for_and_the_last_value_seen():
    calls = itertools.count(1)

    def rows() -> list[int]:
        next(calls)
        return []

    with pytest.raises(AssertionError, match=r"after 0\.05 s waiting for the LISTEN") as e:
        wait_until(rows, timeout=0.05, what="the LISTEN")
    assert str(e.value).endswith("last seen: []")
    assert next(calls) > 2  # it looked again until the timeout, not once
