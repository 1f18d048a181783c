"""A handler cannot end the claim's transaction, and when something ends it anyway the batch is
settled from what really ran: only a job whose own handler ran, and whose work committed, counts
as completed; the others run again."""

from __future__ import annotations

import json

import pytest

from oncebox import Box, Retry
from oncebox.kernel.errors import TransactionControlRefused
from oncebox.store import guard
from oncebox.testing import drain
from support.db import create_effects, effects, record_effect


@pytest.mark.parametrize(
    "statement",
    [
        "/* /* */ */ COMMIT",
        "/* a /* nested */ comment */ COMMIT",
        "SELECT 1; /* /* */ */ COMMIT",
        "SELECT ';'; COMMIT",
        "SELECT $$;$$; COMMIT",
        "SELECT $tag$ ; $tag$; ROLLBACK",
        "-- a line\n/* /* x */ */\n  end",
    ],
)
def test_transaction_control_hidden_behind_comments_or_literals_is_refused(statement):
    with pytest.raises(TransactionControlRefused):
        guard.check_statement(statement)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 'COMMIT'",
        "SELECT $$ ; COMMIT $$",
        "/* COMMIT */ SELECT 1",
        "SELECT 1 -- ; COMMIT",
        'SELECT "commit" FROM t',
        "SAVEPOINT mine; ROLLBACK TO SAVEPOINT mine; RELEASE SAVEPOINT mine",
        "UPDATE t SET ended = true",
    ],
)
def test_statements_that_only_mention_transaction_words_pass(statement):
    guard.check_statement(statement)


@pytest.mark.postgres
def test_the_raw_driver_connection_is_not_reachable_through_the_guard(pg_url):
    box = Box(pg_url)
    reached: list[str] = []

    @box.task(key="r/{n}", retry=Retry(max_attempts=1))
    def r(ctx, n: int) -> None:
        for route in ("pgconn", "_pgconn"):
            try:
                getattr(ctx.connection, route)
                reached.append(route)
            except (TransactionControlRefused, AttributeError):
                pass
        cursor = ctx.connection.cursor()
        for route in ("_conn", "_pgconn", "pgconn"):
            try:
                getattr(cursor, route)
                reached.append(f"cursor.{route}")
            except (TransactionControlRefused, AttributeError):
                pass

    box.enqueue(r, n=1)
    drain(box)
    assert reached == []
    box.close()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("statement", "culprits_write"), [("COMMIT", [("h/3", "n3")]), ("ROLLBACK", [])]
)
def test_after_a_transaction_end_the_guard_missed_only_jobs_whose_handler_ran_count_as_completed(
    pg_url, monkeypatch, statement, culprits_write
):
    """Jobs 1..4 share one transaction; 2 fails, 3 ends it behind the guard's back (simulated by
    switching the statement check off). After a COMMIT: job 1 ran and its work committed, so it
    is completed, with its message; job 2's failure stands and leaves no intent; job 4 never ran,
    and its claim (committed by job 3) must not make it count as done — it runs again. After a
    ROLLBACK nothing of the batch happened: all but job 3 run again. Job 3 is dead either way."""
    monkeypatch.setattr(guard, "check_statement", lambda *_a, **_k: None)
    box = Box(pg_url, secret="test-secret-not-for-production")
    create_effects(box)

    @box.task(key="h/{n}", retry=Retry(max_attempts=1))
    def h(ctx, n: int) -> None:
        record_effect(ctx, f"n{n}")
        ctx.outbox.email(to=f"n{n}@example.com", subject=f"n{n}", text="x")
        if n == 2:
            raise ValueError("job 2 fails")
        if n == 3:
            ctx.connection.execute(statement)

    for n in (1, 2, 3, 4):
        box.enqueue(h, n=n)
    drain(box, raise_on_failure=False, dispatch=False)
    states = {n: (box.find(f"h/{n}")[0].state, box.find(f"h/{n}")[0].outcome) for n in range(1, 5)}
    assert states == {
        1: ("done", "completed"),
        2: ("dead", None),
        3: ("dead", None),
        4: ("done", "completed"),
    }
    assert {k for k in (f"h/{n}" for n in range(1, 5)) if box.store.intent_get(k)} == {
        "h/1",
        "h/4",
    }
    # each job's work happened once; job 3's own write stands only if it committed it
    assert effects(box) == sorted([("h/1", "n1"), ("h/4", "n4"), *culprits_write])
    written = sorted(
        (key, json.loads(row.payload_json)["subject"])
        for key in (f"h/{n}" for n in range(1, 5))
        for row in box.store.outbox_find_by_key(key)
    )
    assert written == [("h/1", "n1"), ("h/4", "n4")]
    box.close()
