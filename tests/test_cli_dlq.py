"""`oncebox dlq` filters, dry runs and discards, in process (click's runner) on a database
with two dead jobs: the filters narrow the listing and the batches, a dry run names the keys it
would move and writes nothing, a discarded job frees its key, and every bad filter or form is
one line on stderr, exit 2, with nothing written. (The same, end to end in a real process on
the freight app: tests/test_cli_commands.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from oncebox import Box, Retry
from oncebox.cli.app import main
from oncebox.store.params import JobFilter
from oncebox.testing import drain

POISON, GHOST = "greeting/poison", "greeting/ghost"


@pytest.fixture
def dead_db(tmp_path: Path) -> str:
    """Two dead jobs: greeting/poison (ValueError, over two lines) and greeting/ghost
    (KeyError)."""
    url = f"sqlite:///{tmp_path / 'dlq.db'}"
    box = Box(url)
    try:

        @box.task(key="greeting/{name}", retry=Retry(max_attempts=1))
        def greet(ctx, name: str) -> None:
            if name == "poison":
                raise ValueError("cannot greet poison\nsecond line")
            raise KeyError(name)

        box.enqueue(greet, name="poison")
        box.enqueue(greet, name="ghost")
        drain(box, raise_on_failure=False)
    finally:
        box.close()
    return url


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, [*args, "--db", url])


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result.stdout


def written(url: str) -> tuple[int, dict[str | None, str]]:
    """The audit rows and every job's state: what a dry run and a refusal leave alone."""
    box = Box(url)
    try:
        states = {j.key: str(j.state) for j in box.store.job_list(JobFilter(limit=100))}
        return len(box.store.audit_list()), states
    finally:
        box.close()


def listed(url: str, *filters: str) -> list[str]:
    return [r["key"] for r in json.loads(ok(invoke(url, "dlq", "list", *filters, "--json")))]


def test_dlq_list_filters_each_narrow_the_listing(dead_db):
    assert listed(dead_db) == [GHOST, POISON]
    assert listed(dead_db, "--error", "POISON") == [POISON]
    assert listed(dead_db, "--error", "second line") == [POISON]
    assert listed(dead_db, "--error", "keyerror", "--newer-than", "1h") == [GHOST]
    assert listed(dead_db, "--newer-than", "1d") == [GHOST, POISON]
    assert listed(dead_db, "--older-than", "1h30m") == []
    assert listed(dead_db, "--period", "2026-W33") == []  # enqueued by hand: no period
    text = ok(invoke(dead_db, "dlq", "list", "--older-than", "30m"))
    assert text == "no dead letters\n"


def test_a_replay_dry_run_lists_the_keys_it_would_move_and_writes_nothing(dead_db):
    before = written(dead_db)
    text = ok(invoke(dead_db, "dlq", "replay", "--all", "--dry-run"))
    lines = text.splitlines()
    assert lines[0].split() == ["KIND", "ID", "KEY", "TASK/CHANNEL", "LAST", "ERROR"]
    assert lines[1].split()[:4] == ["job", "2", GHOST, "greet"]
    assert lines[2].split()[:4] == ["job", "1", POISON, "greet"]
    assert lines[2].endswith("ValueError: cannot greet poison")  # the error's first line
    assert lines[3:] == ["2 would be replayed; nothing was changed"]
    filtered = ok(invoke(dead_db, "dlq", "replay", "--all", "--error", "poison", "--dry-run"))
    assert GHOST not in filtered
    assert filtered.splitlines()[-1] == "1 would be replayed; nothing was changed"
    plan = json.loads(ok(invoke(dead_db, "dlq", "replay", "--all", "--dry-run", "--json")))
    assert (plan["action"], plan["dry_run"], plan["count"], plan["more"]) == (
        "replay",
        True,
        2,
        False,
    )
    assert [(r["kind"], r["key"], r["task"], r["attempt"]) for r in plan["rows"]] == [
        ("job", GHOST, "greet", 1),
        ("job", POISON, "greet", 1),
    ]
    capped = ok(invoke(dead_db, "dlq", "replay", "--all", "--limit", "1", "--dry-run"))
    assert "more dead letters match than --limit 1" in capped
    assert written(dead_db) == before == (0, {POISON: "dead", GHOST: "dead"})


def test_replay_all_with_a_filter_replays_only_what_it_matches(dead_db):
    text = ok(invoke(dead_db, "dlq", "replay", "--all", "--error", "poison", "--reason", "fixed"))
    assert text.splitlines() == [
        f"job 1 ({POISON}) is ready again; audit #1",
        "1 replayed",
    ]
    assert written(dead_db) == (1, {POISON: "ready", GHOST: "dead"})


def test_dlq_discard_of_a_dead_job_frees_its_key_and_a_second_one_is_refused(dead_db):
    text = ok(invoke(dead_db, "dlq", "discard", GHOST, "--reason", "customer gone"))
    assert text == (
        f"job 2 ({GHOST}) discarded: cancelled, its attempts kept, its key free; audit #1\n"
    )
    again = invoke(dead_db, "dlq", "discard", "2", "--reason", "again")
    assert refused(again) == (
        "oncebox: cannot discard '2': job 2 is cancelled; only dead jobs can be discarded"
    )
    assert "no job or outbox row" in refused(
        invoke(dead_db, "dlq", "discard", GHOST, "--reason", "x")
    )
    assert written(dead_db) == (1, {POISON: "dead", GHOST: "cancelled"})
    box = Box(dead_db)
    try:
        assert [a.action for a in box.store.audit_list()] == ["discard"]
        assert [a.outcome for a in box.store.job_attempt_list(2)] == ["dead"]

        @box.task(key="greeting/{name}")
        def greet(ctx, name: str) -> None:
            pass

        assert box.enqueue(greet, name="ghost").created  # the key is free again
    finally:
        box.close()


def test_discard_all_previews_then_discards_only_what_the_filter_matches(dead_db):
    preview = ok(invoke(dead_db, "dlq", "discard", "--all", "--error", "KeyError", "--dry-run"))
    assert GHOST in preview and POISON not in preview
    assert preview.splitlines()[-1] == "1 would be discarded; nothing was changed"
    assert written(dead_db)[0] == 0
    done = json.loads(
        ok(
            invoke(
                dead_db, "dlq", "discard", "--all", "--error", "KeyError", "--reason", "r", "--json"
            )
        )
    )
    assert [(d["kind"], d["key"], d["discard"]) for d in done] == [("job", GHOST, None)]
    assert written(dead_db) == (1, {POISON: "dead", GHOST: "cancelled"})


def refused(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output and "unexpected" not in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("dlq", "list", "--older-than", "3x"), "--older-than '3x' is not a duration like 30m"),
        (("dlq", "list", "--newer-than", "1.5h"), "--newer-than '1.5h' is not a duration"),
        (("dlq", "list", "--older-than", "-2h"), "--older-than '-2h' is not a duration"),
        (("dlq", "list", "--older-than", ""), "--older-than '' is not a duration"),
        (("dlq", "list", "--newer-than", "0m"), "--newer-than 0 matches nothing"),
        (("dlq", "list", "--older-than", "2h", "--newer-than", "1h"), "matches nothing"),
        (("dlq", "list", "--error", " "), "--error is empty"),
        (("dlq", "list", "--period", ""), "--period is empty"),
        (("dlq", "replay", "--all", "--older-than", "2 hours", "--dry-run"), "not a duration"),
        (("dlq", "replay", "--all"), "Missing option '--reason'"),
        (("dlq", "replay", POISON, "--dry-run"), "--dry-run previews --all"),
        (("dlq", "replay", POISON, "--error", "x", "--reason", "r"), "these filter --all"),
        (
            ("dlq", "replay", "--all", "--kind", "job", "--channel", "email", "--dry-run"),
            "--channel",
        ),
        (("dlq", "discard", "--reason", "r"), "not both and not neither"),
        (("dlq", "discard", POISON), "Missing option '--reason'"),
        (("dlq", "discard", POISON, "--reason", " "), "a reason is required"),
        (("dlq", "discard", POISON, "--period", "2026-W33", "--reason", "r"), "filter --all"),
        (("dlq", "discard", "greeting/nobody", "--reason", "r"), "no job or outbox row"),
        (("dlq", "discard", "--all", "--newer-than", "1w", "--reason", "r"), "not a duration"),
        (("dlq", "discard", "1", "--kind", "delivery", "--reason", "r"), "no job or outbox row"),
    ],
)
def test_a_bad_filter_or_form_is_one_line_exit_2_and_writes_nothing(dead_db, args, needle):
    before = written(dead_db)
    message = refused(invoke(dead_db, *args))
    assert needle in message, message
    assert written(dead_db) == before
