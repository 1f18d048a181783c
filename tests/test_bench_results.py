"""Every file in bench/results/ is either a current result, named so in docs/benchmarks.md's
table of results files, or carries a top-level "superseded" field saying why and what
supersedes it — and the table and the files agree. The stale-statistics comparisons (no-op
2.58x pgqueuer) were withdrawn in the docs but still claimed their ratios from the files
(issue 43, item 7)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
HEADING = "## The results files (`bench/results/`)"
ROW = re.compile(r"^\| `([^`]+)` \| (current|superseded) \|")


def table() -> list[tuple[str, str]]:
    """(file, status) for each row of the doc's table of results files, in order."""
    text = DOC.read_text()
    assert HEADING in text, f"docs/benchmarks.md has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n#", 1)[0]
    rows = [match.groups() for line in section.splitlines() if (match := ROW.match(line))]
    assert rows, f"no rows `| \\`file.json\\` | current|superseded | …` under {HEADING!r}"
    return [(name, status) for name, status in rows]


def read(name: str) -> dict[str, Any]:
    figures = json.loads((RESULTS / name).read_text())
    assert isinstance(figures, dict), f"{name}: not a JSON object"
    return figures


def test_the_docs_table_lists_every_results_file_once_and_no_other():
    listed = [name for name, _status in table()]
    on_disk = sorted(p.name for p in RESULTS.glob("*.json"))
    assert sorted(listed) == on_disk, (
        f"not in the table: {sorted(set(on_disk) - set(listed))}; "
        f"in the table, not in bench/results: {sorted(set(listed) - set(on_disk))}"
    )
    assert len(listed) == len(set(listed)), f"listed twice: {listed}"


def test_a_file_is_labelled_superseded_exactly_when_the_table_says_so():
    """A new run of bench/compare.py writes a fresh latest.json, without the label: the table
    must then say current, and this test says which row to change."""
    disagree = {
        name: (status, read(name).get("superseded"))
        for name, status in table()
        if (status == "superseded") != ("superseded" in read(name))
    }
    assert disagree == {}, f"table status against the file's 'superseded' field: {disagree}"


def test_a_superseded_file_says_in_one_sentence_why_and_which_current_file_supersedes_it():
    current = {name for name, status in table() if status == "current"}
    for name, status in table():
        if status != "superseded":
            continue
        said = read(name)["superseded"]
        assert isinstance(said, str) and said.endswith(".") and ". " not in said, (name, said)
        named = re.findall(r"bench/results/([\w.-]+\.json)", said)
        assert named and set(named) <= current, (
            f"{name}: names {named}, of which current: {sorted(set(named) & current)}"
        )
