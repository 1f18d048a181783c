"""The command samples in docs/cli.md and docs/runbook.md are what the commands print today: the
story that wrote them (tests/support/doc_story.py, `make doc-samples`) runs again, and every
marked block must equal its commands' output but for what no two runs share (`mask`). A sample
edited by hand, or a command whose output changed, fails here until `make doc-samples` is run."""

from __future__ import annotations

import difflib

import pytest

from support.doc_samples import Block, blocks, expected, mask
from support.doc_story import documents, record

pytestmark = pytest.mark.timeout(300)  # the story takes about 35 s on two busy cores

MARKED = [block for doc in documents() for block in blocks(doc)]


@pytest.fixture(scope="module")
def samples() -> dict[str, str]:
    return record()


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


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("an id", ("job 73 enqueued", "job 74 enqueued")),
        ("a count", ("35 completed", "36 completed")),
        ("the schema version", ("(schema 7)", "(schema 4)")),
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
