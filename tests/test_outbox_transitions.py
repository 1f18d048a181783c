"""The outbox state table in `oncebox.outbox.transitions` is the code: every named transition
in the table exists, builds the state it names and spends an attempt exactly when it says."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from oncebox.outbox import transitions
from oncebox.outbox.transitions import OutboxFinish

SECOND = timedelta(seconds=1)
CALLS: dict[str, Callable[[], OutboxFinish]] = {
    "give_back": lambda: transitions.give_back(7, 3 * SECOND),
    "sent": lambda: transitions.sent(7, "receipt-1"),
    "retry": lambda: transitions.retry(7, 5 * SECOND, "503"),
    "throttled": lambda: transitions.throttled(7, 2 * SECOND, "429"),
    "dead": lambda: transitions.dead(7, "550 no such user"),
    "resend_same_key": lambda: transitions.resend_same_key(7, SECOND, "timeout"),
    "resend_possible_duplicate": lambda: transitions.resend_possible_duplicate(7, "reset"),
    "hold_ambiguous": lambda: transitions.hold_ambiguous(7, "lost ack"),
    "hold_past_window": lambda: transitions.hold_past_window(7, "window passed"),
    "unsent_after_expiry": lambda: transitions.unsent_after_expiry(7),
    "resend_after_expiry": lambda: transitions.resend_after_expiry(7, "lease expired"),
    "dead_after_rescues": lambda: transitions.dead_after_rescues(7, "lease ran out 3 times"),
    "held_after_rescues": lambda: transitions.held_after_rescues(7, "lease ran out 3 times"),
}
STATES = {"pending", "leased", "sending", "sent", "dead", "ambiguous", "discarded"}


def table() -> list[tuple[str, str, str, str]]:
    """(from, to, transition, attempt) for each row of the module docstring's table."""
    doc = transitions.__doc__ or ""
    rows = []
    for line in doc.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if (
            len(cells) >= 4
            and cells[1] in STATES
            and cells[0].split(" ")[0].split("|")[0] in STATES
        ):
            rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows


def test_the_state_table_names_every_transition_function_and_only_those():
    named = {row[2] for row in table() if not row[2].startswith("(")}
    functions = {
        name
        for name, fn in inspect.getmembers(transitions, inspect.isfunction)
        if fn.__module__ == transitions.__name__ and name != "past_window"
    }
    assert named == functions == set(CALLS), (named, functions)


@pytest.mark.parametrize("row", [r for r in table() if not r[2].startswith("(")], ids=str)
def test_each_transition_builds_the_state_and_attempt_its_row_names(row):
    _from, to, name, attempt = row
    finish = CALLS[name]()
    assert finish.id == 7
    assert finish.state == to, (name, finish)
    assert finish.counts_attempt is (attempt == "yes"), (name, finish)


def test_only_a_wait_records_no_delivery_attempt():
    silent = {name for name, call in CALLS.items() if call().outcome is None}
    assert silent == {"give_back", "unsent_after_expiry"}


def test_resends_after_an_unknown_outcome_are_marked_so_the_window_can_hold_them_later():
    assert transitions.resend_same_key(1, SECOND, "t").uncertain is True
    assert transitions.resend_after_expiry(1, "t").uncertain is True
    assert transitions.resend_possible_duplicate(1, "t").possible_duplicate is True
    assert transitions.retry(1, SECOND, "t").uncertain is None  # leaves the row's flag alone


def test_past_window_counts_from_the_first_lease_and_never_passes_without_a_window():
    first = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    day = timedelta(hours=24)
    assert not transitions.past_window(None, first, first + 1000 * day)
    assert not transitions.past_window(day, None, first + 1000 * day)
    assert not transitions.past_window(day, first, first + day - SECOND)
    assert transitions.past_window(day, first, first + day)
