"""SQL lives in named files by noun, one folder per dialect; migrations and snapshots agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oncebox.store.sqlfiles import (
    DIALECT_ONLY,
    load_migrations,
    load_queries,
    parse_blocks,
    parse_files,
    query_files,
)
from support.schema_dump import dump_postgres, dump_sqlite

SRC = Path(__file__).resolve().parents[1] / "src" / "oncebox"
SQL = SRC / "store" / "sql"
SNAPSHOT = Path("migrations") / "schema.sql"  # beside the migrations it records


def _names(dialect: str) -> set[str]:
    return set(load_queries(dialect))


def test_both_dialects_define_the_same_operations():
    sqlite, postgres = _names("sqlite"), _names("postgres")
    # `op__step` blocks are steps of one operation on a dialect without data-modifying CTEs
    sqlite_ops = {n for n in sqlite if "__" not in n}
    postgres_ops = {n for n in postgres if "__" not in n}
    assert sqlite_ops ^ postgres_ops == {n for n in DIALECT_ONLY if n in sqlite_ops ^ postgres_ops}
    assert {n.split("__")[0] for n in sqlite | postgres if "__" in n} <= sqlite_ops & postgres_ops
    assert set(DIALECT_ONLY) <= sqlite ^ postgres


def test_every_query_name_is_used_by_the_code():
    code = "\n".join(p.read_text() for p in (SRC / "store").glob("*.py"))
    literals = set(re.findall(r'"([a-z_]+)"', code))
    for dialect in ("sqlite", "postgres"):
        missing = set()
        for name in _names(dialect):
            operation, _, step = name.partition("__")
            if name in literals or (step and operation in literals and f'__{step}"' in code):
                continue
            missing.add(name)
        assert not missing, f"{dialect} queries never used: {sorted(missing)}"


def test_a_query_file_cannot_define_a_name_twice():
    with pytest.raises(ValueError, match="defined twice"):
        parse_blocks("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_two_query_files_cannot_define_the_same_name():
    texts = {"jobs.sql": "-- name: a\nSELECT 1;\n", "outbox.sql": "-- name: a\nSELECT 2;\n"}
    with pytest.raises(ValueError, match=r"'a' is defined twice: in jobs\.sql and outbox\.sql"):
        parse_files(texts)


def test_both_dialects_split_their_queries_into_the_same_files():
    sqlite, postgres = query_files("sqlite"), query_files("postgres")
    assert sqlite == postgres, (
        f"only in sqlite: {sorted(set(sqlite) - set(postgres))}, "
        f"only in postgres: {sorted(set(postgres) - set(sqlite))}"
    )
    assert "jobs.sql" in sqlite and "schema.sql" not in sqlite  # the snapshot is in migrations/


def test_a_statement_is_in_the_same_file_in_both_dialects():
    def homes(dialect: str) -> dict[str, str]:
        folder = SQL / dialect
        return {
            name: file.name
            for file in sorted(folder.glob("*.sql"))
            for name in parse_blocks(file.read_text())
        }

    sqlite, postgres = homes("sqlite"), homes("postgres")
    moved = {
        n: (sqlite[n], postgres[n])
        for n in sqlite.keys() & postgres.keys()
        if sqlite[n] != postgres[n]
    }
    assert moved == {}


def test_migrations_are_numbered_without_gaps():
    for dialect in ("sqlite", "postgres"):
        versions = [m.version for m in load_migrations(dialect)]
        assert versions == list(range(1, len(versions) + 1))


def test_sqlite_migrations_produce_the_snapshot(sqlite_url, tmp_path):
    from oncebox.store import open_store

    open_store(sqlite_url).close()
    path = sqlite_url.removeprefix("sqlite:///")
    assert dump_sqlite(path) == (SQL / "sqlite" / SNAPSHOT).read_text(), (
        "run `make schema-snapshot` after changing a migration, and review the diff"
    )


@pytest.mark.postgres
def test_postgres_migrations_produce_the_snapshot(pg_url):
    assert dump_postgres(pg_url) == (SQL / "postgres" / SNAPSHOT).read_text(), (
        "run `make schema-snapshot` after changing a migration, and review the diff"
    )


def test_no_code_outside_the_stores_imports_a_driver_or_holds_sql():
    offenders = []
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC).as_posix()
        # the chaos and simulation checkers read the database with their own SQL on purpose: an
        # observer that used the store's queries would share their bugs
        if relative.startswith(("store/", "examples/", "chaos/", "sim/")):
            continue
        text = path.read_text()
        if re.search(r"^\s*(import|from)\s+(sqlite3|psycopg)", text, re.MULTILINE):
            offenders.append(relative)
    assert offenders == []


def test_only_clock_py_reads_the_wall_clock_or_sleeps():
    pattern = re.compile(
        r"datetime\.now\(|time\.time\(|time\.sleep\(|datetime\.utcnow\(|date\.today\("
    )
    offenders = [
        p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*.py")
        if p.name != "clock.py" and pattern.search(p.read_text())
    ]
    assert offenders == []
