"""docs/security.md names, for each control, the tests that pin it: each name must be a test that
exists, so a renamed or deleted test cannot leave a control claimed but unpinned. A name may be
shortened with `…` (`tests/test_api.py` (`…budget…`)): some test of that file must contain each
part."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "security.md"
FULL = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")
FILE = re.compile(r"`(tests/[\w/]+\.py)`")
PART = re.compile(r"`…(\w+)…?`|`(\w+)…`")


def names_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def cells() -> list[str]:
    """Each table cell and paragraph that names a test file."""
    text = DOC.read_text()
    return [part for part in re.split(r"\|\n|\n\n", text) if "tests/" in part]


def test_every_test_the_security_page_names_exists() -> None:
    missing: list[str] = []
    for cell in cells():
        for file, name in FULL.findall(cell):
            if name not in names_in(ROOT / file):
                missing.append(f"{file}::{name}")
        for chunk in re.split(r"(?=`tests/)", cell):
            found = FILE.match(chunk)
            if not found:
                continue
            names = names_in(ROOT / found.group(1))
            for part in [a or b for a, b in PART.findall(chunk)]:
                if not any(part.strip("_") in name for name in names):
                    missing.append(f"{found.group(1)}: no test containing {part!r}")
    assert not missing, missing


def test_every_control_names_a_test() -> None:
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| **")]
    assert len(rows) >= 15, len(rows)
    unpinned = [row.split("|")[1].strip() for row in rows if "tests/" not in row.split("|")[3]]
    assert not unpinned, unpinned
