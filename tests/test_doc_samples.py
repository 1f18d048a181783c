"""The command samples in docs/cli.md, runbook.md and deploy.md are what the commands print: the
story that wrote them (tests/support/doc_story.py, `make doc-samples`) runs again, and every
marked block must equal its commands' output but for what no two runs share (`mask`). A sample
edited by hand, or a command whose output changed, fails here until `make doc-samples` is run.

And the guide's schedule is the README's, with its defaults spelled out: a reader who follows one
does not meet a different declaration in the other (a timezone that the key-drift guard would
refuse, a task named by a string)."""

from __future__ import annotations

import ast
import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oncebox.store.sqlfiles import load_migrations
from support import shared_story
from support.doc_samples import Block, blocks, expected, mask
from support.doc_story import documents, record
from test_readme import readme_example

pytestmark = pytest.mark.timeout(300)  # the story takes about 35 s on two busy cores

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"
MARKED = [block for doc in documents() for block in blocks(doc)]


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, str]:
    """One run of the story for the session (support/shared_story.py)."""
    if worker_id == "master":  # one process: nobody to share with
        return record()
    return shared_story.samples(tmp_path_factory.getbasetemp().parent)


@pytest.mark.slow
@pytest.mark.parametrize("block", MARKED, ids=lambda block: block.where)
def test_the_sample_is_what_its_commands_print(block: Block, samples: dict[str, str]) -> None:
    unknown = [name for name in block.names if name not in samples]
    assert not unknown, f"{block.where}: the story records no sample named {unknown}"
    shown, printed = mask(block.text), mask(expected(block, samples))
    diff = "\n".join(
        difflib.unified_diff(
            shown.split("\n"), printed.split("\n"), "the docs", "the commands", lineterm=""
        )
    )
    assert shown == printed, (
        f"{block.where} differs from what its commands print now (masked; run `make "
        f"doc-samples` if the new output is right):\n{diff}"
    )


def test_the_docs_mark_their_samples() -> None:
    """A marker that lost its block, or a rename in the story, would leave a page unchecked."""
    assert len(MARKED) >= 50, [block.where for block in MARKED]
    names = [name for block in MARKED for name in block.names]
    assert {"status", "status-clock-line", "worker-work-remains"} <= set(names)


SCHEMA = load_migrations("sqlite")[-1].version  # what every fresh sample shows


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("an id", ("job 73 enqueued", "job 74 enqueued")),
        ("a count", ("35 completed", "36 completed")),
        ("the schema version", (f"(schema {SCHEMA})", "(schema 4)")),
        ("a state", ("state=dead", "state=done")),
        ("an outbox column", (", discarded 1", "")),
        ("a table's alignment to another column", ("NAME           CRON", "NAME CRON")),
    ],
)
def test_a_hand_edit_of_a_sample_is_not_masked(name: str, edit: tuple[str, str]) -> None:
    old, new = edit
    block = next((block for block in MARKED if old in block.text), None)
    assert block is not None, f"no sample shows {old!r} any more: pick another edit"
    assert mask(block.text.replace(old, new, 1)) != mask(block.text), name


def test_what_no_two_runs_share_is_masked() -> None:
    one = (
        "2026-12-03 07:35:45,668 INFO oncebox: stored a new HMAC secret\n"
        "  attempt 1: dead by vm:32598:c0 at 2026-11-30T09:00:30Z: x\n"
        "frozen at 2026-11-30T09:01:00+00:00 by vm:1454, lapses at 2026-12-03T07:46:14+00:00\n"
        "ready, next due 2026-12-03T08:05:42+00:00 (in 29m); oldest due job waiting 1s\n"
        '"receipt": "5207343e63442cbbd489a2e61737da76.eml", "oldest_due_ready_age_s": 0.25\n'
        "the .eml files are in /tmp/oncebox-doc-story-osgkws0n/oncebox-demo-outbox\n"
        "manual-rerun · sqlite · seed 1 · 1.0 s · ok\n"
        "smtp://127.0.0.1:2525: the connection failed"
    )
    other = (
        "2027-01-04 10:00:00,001 INFO oncebox: stored a new HMAC secret\n"
        "  attempt 1: dead by ci-runner-7:4:c0 at 2026-11-30T09:00:30.5Z: x\n"
        "frozen at 2026-11-30T09:01:00+00:00 by ci-7:4, lapses at 2027-01-04T10:00:00+00:00\n"
        "ready, next due 2027-01-04T10:29:59+00:00 (in 30m); oldest due job waiting 2m\n"
        '"receipt": "0123456789abcdef0123456789abcdef.eml", "oldest_due_ready_age_s": 61.5\n'
        "the .eml files are in /var/tmp/x/oncebox-doc-story-a1/oncebox-demo-outbox\n"
        "manual-rerun · sqlite · seed 1 · 12.0 s · ok\n"
        "smtp://127.0.0.1:40123: the connection failed"
    )
    assert mask(one) == mask(other)


def _schedule_call(source: str) -> tuple[ast.Call, str]:
    """The `@box.schedule(…)` decorator of the module's schedule, and the function's name."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if (
                    isinstance(decorator, ast.Call)
                    and ast.unparse(decorator.func) == "box.schedule"
                ):
                    return decorator, node.name
    raise AssertionError(f"no @box.schedule in:\n{source}")


def guide_schedule() -> str:
    text = GUIDE.read_text()
    section = text[text.index("## Schedules and periods") :]
    return section[section.index("```python\n") + len("```python\n") : section.index("```\n\n")]


def test_the_guides_schedule_is_the_readmes_with_its_defaults_spelled_out() -> None:
    readme, readme_name = _schedule_call(readme_example())
    guide, guide_name = _schedule_call(guide_schedule())
    assert guide_name == readme_name
    assert [ast.dump(a) for a in guide.args] == [ast.dump(a) for a in readme.args]
    readme_kw = {k.arg: ast.dump(k.value) for k in readme.keywords}
    guide_kw = {k.arg: ast.dump(k.value) for k in guide.keywords}
    assert {k: guide_kw.get(k) for k in readme_kw} == readme_kw
    spelled_out = {
        k.arg: ast.literal_eval(k.value) for k in guide.keywords if k.arg not in readme_kw
    }
    assert spelled_out == {"catch_up": "latest", "overlap": "wait"}  # `Box.schedule`'s defaults


def test_the_guides_schedule_runs_in_the_readmes_example(tmp_path: Path) -> None:
    """The README's module with its schedule replaced by the guide's: a fan-out enqueues one
    digest per active customer of the guide's query."""
    readme = readme_example()
    head, tail = readme.split("@box.schedule", 1)
    module = head + guide_schedule() + "\n" + "if __name__" + tail.split("if __name__", 1)[1]
    (tmp_path / "freight.py").write_text(module)
    script = """\
import sqlite3
from oncebox.store.params import JobFilter

conn = sqlite3.connect("freight.db")
conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, active INTEGER)")
conn.executemany("INSERT INTO customers VALUES (?, ?)", [(41, 1), (42, 0), (43, 1)])
conn.commit()

import freight

result = freight.box.run_schedule("weekly-digest", "2026-W33")
print(result.eligible, result.enqueued)
print(sorted(job.key for job in freight.box.store.job_list(JobFilter(limit=10))))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEBOX_")}
    env["ONCEBOX_DB"] = "sqlite:///freight.db"
    ran = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split("\n")[:2] == [
        "2 2",
        "['weekly-digest/customer-41/2026-W33', 'weekly-digest/customer-43/2026-W33']",
    ]
