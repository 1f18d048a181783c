"""The fences of the store's writes, as their `.sql` files declare them (tests/test_fences.py).

Every named statement that changes rows — an UPDATE, a DELETE, an upsert's DO UPDATE — says in
its comment lines what makes it a compare-and-set on what its writer decided from:

    -- fence: lease_token, attempt          the columns its WHERE compares with what was read
    -- fence: locked by rate_bucket_select  decided under the row locks that statement took
                                             earlier in the same transaction
    -- no fence: <why none is needed>        e.g. a prune of rows no one acts on any more

One declaration a statement, the last of its comment lines (a long one wraps onto the lines
below it). Only counter increments need nothing (`value = c.value + excluded.value`: increments
commute).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from oncebox.store.sqlfiles import query_files

_NAME = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_DECLARATION = re.compile(r"^--\s*(no fence|fence):\s*(.*)$")
# increments of the sharded counters and depths: they commute, whoever writes first
_INCREMENT = re.compile(
    r"ON CONFLICT \([a-z_, ]+\)\s+DO UPDATE SET value = [a-z]\.value \+ excluded\.value",
    re.IGNORECASE,
)
_LOCKING = re.compile(r"\bFOR\s+(NO\s+KEY\s+)?UPDATE\b", re.IGNORECASE)
_WRITE = re.compile(r"\b(UPDATE|DELETE)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Write:
    dialect: str
    file: str
    name: str
    code: str  # the statement without its comments
    fence: tuple[str, ...]  # the declared fence's terms; empty with `no fence`
    no_fence: str | None  # the reason none is needed
    declarations: int  # how many declaration lines its comments hold (one is right)


def code_of(sql: str) -> str:
    """The statement without comments (whole-line and trailing ones)."""
    lines = []
    for line in sql.splitlines():
        if line.strip().startswith("--"):
            continue
        lines.append(re.sub(r"--.*$", "", line))
    return "\n".join(lines)


# what a statement writes or returns, not what it compares: a SET list (up to the clause after
# it), an INSERT's column list, a RETURNING list (up to the end of its CTE or statement)
_NOT_CONDITIONS = (
    re.compile(r"\bSET\b.*?(?=\bFROM\b|\bWHERE\b|\bRETURNING\b|$)", re.IGNORECASE | re.DOTALL),
    re.compile(r"\bINSERT INTO\s+\S+(\s+AS\s+\w+)?\s*\([^)]*\)", re.IGNORECASE),
    re.compile(r"\bRETURNING\b[^;]*?(?=\n\)|$)", re.IGNORECASE | re.DOTALL),
)


def conditions_of(code: str) -> str:
    """The statement without what it writes or returns: where its fence must be."""
    for pattern in _NOT_CONDITIONS:
        code = pattern.sub(" ", code)
    return code


def writes(sql: str) -> bool:
    """Whether a statement changes existing rows (beyond counter increments)."""
    code = _INCREMENT.sub("", code_of(sql))
    return bool(_WRITE.search(_LOCKING.sub("", code)))


def declaration_of(sql: str) -> tuple[str | None, str, int]:
    """The statement's declaration: its kind (`fence`, `no fence`), its text — from its line to
    the end of the comment lines above the statement, so a long one wraps — and how many
    declaration lines the comments hold."""
    header: list[str] = []
    for line in sql.strip("\n").splitlines():
        if not line.startswith("--"):
            break
        header.append(line)
    starts = [i for i, line in enumerate(header) if _DECLARATION.match(line)]
    if not starts:
        return None, "", 0
    first = _DECLARATION.match(header[starts[0]])
    assert first is not None
    rest = [line.removeprefix("--").strip() for line in header[starts[0] + 1 :]]
    return first.group(1), " ".join([first.group(2).strip(), *rest]).strip(), len(starts)


def statements(dialect: str) -> dict[str, tuple[str, str]]:
    """Every named statement of a dialect with its comments: {name: (file, text)}."""
    folder = resources.files("oncebox.store") / "sql" / dialect
    found: dict[str, tuple[str, str]] = {}
    for file in query_files(dialect):
        text = (folder / file).read_text("utf-8")
        matches = list(_NAME.finditer(text))
        for index, match in enumerate(matches):
            end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
            found[match.group(1)] = (file, text[match.end() : end])
    return found


def fenced_writes(dialect: str) -> list[Write]:
    """The dialect's writing statements with what they declare."""
    found = []
    for name, (file, sql) in statements(dialect).items():
        if not writes(sql):
            continue
        kind, text, count = declaration_of(sql)
        terms = tuple(t.strip() for t in text.split(",") if t.strip()) if kind == "fence" else ()
        reason = text if kind == "no fence" else None
        found.append(Write(dialect, file, name, code_of(sql), terms, reason, count))
    return found


def table() -> str:
    """The rows of docs/guarantees.md's table of fences: every writing statement of PostgreSQL
    (SQLite's share the names; its `op__step` statements are steps of one of these)."""
    rows = ["| Statement | Fenced on |", "|---|---|"]
    for write in sorted(fenced_writes("postgres"), key=lambda w: (w.file, w.name)):
        if "__" in write.name:
            continue
        declared = ", ".join(write.fence) if write.fence else f"none: {write.no_fence}"
        rows.append(f"| `{write.name}` | {declared} |")
    return "\n".join(rows)


def write_table(page: Path) -> None:
    """Rewrite the table between `<!-- fences -->` and `<!-- /fences -->` on `page`."""
    text = page.read_text("utf-8")
    start = text.index("<!-- fences -->") + len("<!-- fences -->")
    end = text.index("<!-- /fences -->")
    page.write_text(text[:start] + "\n" + table() + "\n" + text[end:], "utf-8")


if __name__ == "__main__":
    write_table(Path(__file__).resolve().parents[2] / "docs" / "guarantees.md")
