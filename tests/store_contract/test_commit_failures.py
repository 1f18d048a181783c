"""A batch the database refuses at the end (a deferred constraint at COMMIT, a refused outbox row
or settlement) costs the job that caused it an attempt, and no one else anything: the batch is
retried one job per transaction, the culprit ends dead within its retry policy, the others
complete. Before, the whole batch was given back with its attempts undone, and leased again for
ever."""

from __future__ import annotations

from datetime import timedelta

import pytest

from oncebox import Box, Retry
from oncebox.testing import drain
from support.db import create_effects, effects, record_effect, sql

SECRET = "test-secret-not-for-production"

REFUSE_POISON = {
    "sqlite": [
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON oncebox_outbox "
        "WHEN NEW.payload LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
    ],
    "postgres": [
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.payload::text LIKE '%poison%' THEN RAISE EXCEPTION 'poison refused'; END IF; "
        "RETURN NEW; END $$",
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON oncebox_outbox FOR EACH ROW "
        "EXECUTE FUNCTION refuse_poison()",
    ],
}


def test_a_job_whose_message_the_database_refuses_spends_its_attempts_and_the_others_complete(
    store_url,
):
    box = Box(store_url, secret=SECRET)
    for statement in REFUSE_POISON[box.store.dialect]:
        sql(box, statement)

    @box.task(key="m/{n}", retry=Retry(max_attempts=2, base_delay=timedelta(0)))
    def m(ctx, n: int) -> None:
        ctx.outbox.email(to=f"n{n}@example.com", subject="poison" if n == 3 else "fine", text="x")

    for n in range(1, 7):
        box.enqueue(m, n=n)
    result = drain(box, raise_on_failure=False, dispatch=False)
    jobs = {n: box.find(f"m/{n}")[0] for n in range(1, 7)}
    assert {n: (j.state, j.outcome, j.attempt) for n, j in jobs.items()} == {
        1: ("done", "completed", 1),
        2: ("done", "completed", 1),
        3: ("dead", None, 2),
        4: ("done", "completed", 1),
        5: ("done", "completed", 1),
        6: ("done", "completed", 1),
    }
    assert "poison refused" in (jobs[3].last_error or ""), jobs[3].last_error
    assert box.store.intent_get("m/3") is None
    assert [f.final for f in result.failures if f.key == "m/3"] == [False, True]
    box.close()


@pytest.mark.postgres
def test_a_deferred_constraint_that_fails_at_commit_dead_letters_only_its_job(pg_url):
    box = Box(pg_url, secret=SECRET)
    create_effects(box)
    sql(box, "CREATE TABLE parent (id int PRIMARY KEY)")
    sql(
        box,
        "CREATE TABLE child (parent_id int REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
    )

    @box.task(key="d/{n}", retry=Retry(max_attempts=3, base_delay=timedelta(0)))
    def d(ctx, n: int) -> None:
        record_effect(ctx, f"n{n}")
        if n == 4:  # breaks the constraint; PostgreSQL says so only at COMMIT
            ctx.connection.execute("INSERT INTO child VALUES (404)")

    for n in range(1, 7):
        box.enqueue(d, n=n)
    drain(box, raise_on_failure=False, dispatch=False)
    jobs = {n: box.find(f"d/{n}")[0] for n in range(1, 7)}
    assert {n: (j.state, j.attempt) for n, j in jobs.items()} == {
        1: ("done", 1),
        2: ("done", 1),
        3: ("done", 1),
        4: ("dead", 3),
        5: ("done", 1),
        6: ("done", 1),
    }
    assert "foreign key" in (jobs[4].last_error or ""), jobs[4].last_error
    assert effects(box) == [(f"d/{n}", f"n{n}") for n in (1, 2, 3, 5, 6)]
    box.close()
