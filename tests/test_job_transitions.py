"""The job state table in `oncebox.jobs.transitions` is the code: every named transition in the
table exists and builds the state and outcome its row names, and no settlement in the package
is built with a state of its own."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import oncebox
from oncebox.jobs import transitions
from oncebox.jobs.transitions import JobTransition
from oncebox.queue.transport import Delivery, Settlement

SECOND = timedelta(seconds=1)
CALLS: dict[str, Callable[[], JobTransition]] = {
    "completed": transitions.completed,
    "duplicate": transitions.duplicate,
    "retry": lambda: transitions.retry(5 * SECOND, "503"),
    "dead": lambda: transitions.dead("ValueError: no such account"),
}
STATES = {"ready", "leased", "relayed", "done", "dead", "cancelled"}
PACKAGE = Path(oncebox.__file__).parent
# the records that settle a job, and where their state and outcome sit among positional arguments
SETTLING = {"Settlement": (1, 2), "JobFinish": (1, 2), "RelayedFinish": (2, 3)}


def table() -> list[tuple[str, str, str, str]]:
    """(from, to, outcome, transition) for each row of the module docstring's table."""
    doc = transitions.__doc__ or ""
    rows = []
    for line in doc.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if (
            len(cells) >= 4
            and cells[1].split("|")[0] in STATES
            and (cells[0] == "-" or cells[0].split(" ")[0].split("|")[0] in STATES)
        ):
            rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows


def named_rows() -> list[tuple[str, str, str, str]]:
    return [row for row in table() if not row[3].startswith("(")]


def test_the_state_table_names_every_transition_function_and_only_those():
    named = [row[3] for row in named_rows()]
    functions = {
        name
        for name, fn in inspect.getmembers(transitions, inspect.isfunction)
        if fn.__module__ == transitions.__name__
    }
    assert len(named) == len(set(named)), named
    assert set(named) == functions == set(CALLS), (named, functions)


def test_the_table_covers_every_way_a_settlement_can_end():
    ends = {(to, outcome) for _from, to, outcome, _name in named_rows()}
    assert ends == {("done", "completed"), ("done", "duplicate"), ("ready", "-"), ("dead", "-")}


@pytest.mark.parametrize("row", named_rows(), ids=str)
def test_each_transition_builds_the_state_and_outcome_its_row_names(row):
    _from, to, outcome, name = row
    transition = CALLS[name]()
    assert transition.state == to, (name, transition)
    assert transition.outcome == (None if outcome == "-" else outcome), (name, transition)


def test_only_a_retry_waits_and_only_a_failure_carries_an_error():
    assert transitions.retry(5 * SECOND, "503") == JobTransition("ready", None, 5 * SECOND, "503")
    assert transitions.dead("gone") == JobTransition("dead", None, timedelta(0), "gone")
    assert transitions.completed() == JobTransition("done", "completed", timedelta(0), None)
    assert transitions.duplicate() == JobTransition("done", "duplicate", timedelta(0), None)


def test_a_settlement_of_a_transition_carries_all_of_it():
    at = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    delivery = Delivery("7", "task", "{}", "key-7", 2, 3, at, job_id=7, lease_token="t")
    settlement = Settlement.of(delivery, transitions.retry(5 * SECOND, "503"))
    assert settlement == Settlement(delivery, "ready", None, 5 * SECOND, "503")


def literal_settlements(source: str, where: str) -> list[str]:
    """The calls in `source` that build a settling record with a literal state or outcome."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name not in SETTLING:
            continue
        given = [node.args[i] for i in SETTLING[name] if i < len(node.args)]
        given += [k.value for k in node.keywords if k.arg in ("state", "outcome")]
        if any(isinstance(arg, ast.Constant) and isinstance(arg.value, str) for arg in given):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_settlement_is_built_with_a_state_of_its_own():
    """Every settlement asks `oncebox.jobs.transitions` for its move by name: a literal state or
    outcome in a `Settlement(...)` (or the store's `JobFinish`/`RelayedFinish`) is a move the
    state table does not know about."""
    offenders = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in literal_settlements(path.read_text("utf-8"), str(path.relative_to(PACKAGE)))
    ]
    assert offenders == []


def test_the_literal_settlement_check_sees_each_form():
    samples = [
        'Settlement(d, "done", "completed")',
        'transport.Settlement(d, state="dead", error="x")',
        'JobFinish(id=1, state="done", outcome="completed")',
        'RelayedFinish(1, 2, "dead", None, delay, "x", "w", at)',
        "Settlement.of(d, transitions.completed())",
        "JobFinish(id=1, state=s.state, outcome=s.outcome)",
    ]
    hits = literal_settlements("\n".join(samples), "probe.py")
    assert [hit.split(":")[1] for hit in hits] == ["1", "2", "3", "4"], hits
