"""Every write of the store is a compare-and-set on what its writer decided from (DESIGN.md,
"Proof: fences and simulation"; STYLE.md rule 17): each UPDATE, DELETE and upsert in the
store's `.sql` files declares its fence — the columns its WHERE compares with what was read, or
the statement whose row locks it was decided under — or says why it needs none; and
docs/guarantees.md lists them (support/fences.py reads the declarations)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.fences import conditions_of, fenced_writes, statements, writes

DIALECTS = ("postgres", "sqlite")
GUARANTEES = Path(__file__).resolve().parents[1] / "docs" / "guarantees.md"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_write_declares_its_fence_or_why_it_needs_none(dialect):
    undeclared = [
        f"{w.file}: {w.name}" for w in fenced_writes(dialect) if not w.fence and not w.no_fence
    ]
    assert not undeclared, (
        f"{dialect}: these statements change rows without a `-- fence: …` or `-- no fence: …` "
        f"line: {undeclared}"
    )


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_declared_fence_is_in_its_statement(dialect):
    known = statements(dialect)
    wrong = []
    for write in fenced_writes(dialect):
        if write.declarations > 1:
            wrong.append(f"{write.name}: {write.declarations} declarations, where one says it")
        for term in write.fence:
            locker = re.fullmatch(r"locked by ([a-z_]+)", term)
            if locker:
                name = locker.group(1)
                if name not in known:
                    wrong.append(f"{write.name}: locked by {name}, which is no statement")
                elif dialect == "postgres" and not re.search(
                    r"\bFOR (NO KEY )?UPDATE\b|pg_advisory_xact_lock|DO UPDATE", known[name][1]
                ):
                    wrong.append(f"{write.name}: {name} takes no lock")
                continue
            if term.lower() not in conditions_of(write.code).lower():
                wrong.append(f"{write.name}: its fence {term!r} is in none of its conditions")
    assert not wrong, f"{dialect}: {wrong}"


def test_the_check_sees_a_write_without_a_fence():
    """The reader itself: an unfenced UPDATE is a write, a lock or a counter increment is not."""
    assert writes("-- name: x\nUPDATE t SET a = 1 WHERE id = 1;")
    assert writes("-- name: x\nDELETE FROM t WHERE id = 1;")
    assert writes("INSERT INTO t (k, v) VALUES (1, 2) ON CONFLICT (k) DO UPDATE SET v = 2;")
    assert not writes("SELECT id FROM t WHERE id = 1 FOR UPDATE SKIP LOCKED;")
    assert not writes(
        "INSERT INTO c (name, shard, value) VALUES ('a', 1, 1)\n"
        "ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;"
    )
    assert not writes("SELECT 1; -- an UPDATE in a comment")


def test_a_column_the_statement_only_sets_is_no_fence():
    """A fence is compared, not written: `state` in a SET list or `lease_token` in RETURNING
    fences nothing."""
    unfenced = "UPDATE j SET state = 'ready', lease_token = NULL WHERE id = %(id)s RETURNING state"
    assert "state" not in conditions_of(unfenced) and "lease_token" not in conditions_of(unfenced)
    fenced = "UPDATE j SET state = 'ready' WHERE id = %(id)s AND lease_token = %(token)s"
    assert "lease_token" in conditions_of(fenced)
    upsert = (
        "INSERT INTO r AS r (k, owner, state) VALUES (1, 'a', 'running')\n"
        "ON CONFLICT (k) DO UPDATE SET owner = excluded.owner WHERE r.state = 'done'"
    )
    assert "state" in conditions_of(upsert) and "owner" not in conditions_of(upsert)


def test_the_guarantees_list_every_fence_of_postgresql():
    """docs/guarantees.md's table of fences names every writing statement (PostgreSQL's, whose
    names SQLite shares) with its fence, so the page a reviewer reads is the code's."""
    text = GUARANTEES.read_text("utf-8")
    start = text.index("<!-- fences -->")
    table = text[start : text.index("<!-- /fences -->")]
    listed = dict(re.findall(r"^\| `([a-z_]+)` \| (.+?) \|", table, re.MULTILINE))
    missing = []
    for write in fenced_writes("postgres"):
        if "__" in write.name:
            continue
        declared = ", ".join(write.fence) if write.fence else f"none: {write.no_fence}"
        if listed.get(write.name) != declared:
            missing.append(f"| `{write.name}` | {declared} |")
    assert not missing, "docs/guarantees.md lacks (or differs on) these rows:\n" + "\n".join(
        missing
    )
