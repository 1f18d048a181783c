"""Named SQL blocks, loaded from the `.sql` files of one folder per dialect.

Each dialect's folder (`store/sql/sqlite/`, `store/sql/postgres/`) holds one file per noun the
statements act on — `jobs.sql`, `intents.sql`, `outbox.sql`, `limits.sql`, `schedules.sql`,
`keys.sql`, … — with the same file names and the same statement names in both dialects (apart
from `DIALECT_ONLY`). Every `.sql` file directly in the folder is read; `migrations/` holds the
numbered migrations and the schema snapshot. A name defined twice, in one file or in two, is an
error. Format:

    -- name: job_lease
    -- Lease up to %(limit)s due jobs of the given tasks ...   (description lines, optional)
    UPDATE ...;

PostgreSQL: files write `__S__.` before every oncebox object; the loader replaces it with the
quoted schema name the store was opened with, so the same text serves any schema and is still a
literal the project controls. Time is read only through `oncebox_now()`, once per statement (a
MATERIALIZED CTE), so every row of a statement sees the same instant.

SQLite, different by design:
* time: the store evaluates `oncebox_now()` once per operation, in process (it is the same
  Python function SQL calls), and binds it as `:now`, so every statement of an operation sees
  one instant; instants and durations are integer microseconds;
* sets: lists arrive as one JSON array parameter, read with `json_each`;
* SQLite has no data-modifying CTEs, so an operation PostgreSQL does in one statement may be
  several here, named `operation__step` and run by the store in the same transaction.

Nothing else is ever interpolated into SQL: values are bound parameters.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString

from oncebox.kernel.errors import ConfigurationError

SCHEMA_TOKEN = "__S__"  # noqa: S105 (a placeholder, not a secret)
_NAME_RE = re.compile(r"^-- name: ([a-z][a-z0-9_]*)\s*$", re.MULTILINE)
_IDENTIFIER_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")

#: Query names that exist in one dialect only, with the reason.
DIALECT_ONLY: dict[str, str] = {
    "job_notify": "postgres: LISTEN/NOTIFY wake-ups; SQLite has no notifications",
    "migration_lock": "postgres: advisory lock; SQLite serialises migrations with BEGIN IMMEDIATE",
    "migration_lock_timeout": "postgres: a migration gives up on a busy table rather than hold "
    "every worker's query behind it; on SQLite it waits busy_timeout, as every writer does",
    "migration_schema_create": "postgres: the store's schema, created on the first migration; "
    "SQLite has no schemas",
    "migration_table_exists": "postgres: the status creates nothing; SQLite's creates the "
    "(empty) table, as opening the file created the database",
    "work_listen": "postgres: LISTEN/NOTIFY wake-ups; SQLite has no notifications",
    "outbox_notify": "postgres: LISTEN/NOTIFY wake-ups; SQLite has no notifications",
    "clock_read": "postgres: the shared clock is a table; on SQLite it is a file read in Python",
    "clock_write": "postgres: the shared clock is a table; on SQLite it is a file read in Python",
    "clock_reset": "postgres: the shared clock is a table; on SQLite it is a file read in Python",
    "job_lease_settings": "postgres: planner and commit settings for the lease's transaction",
    "job_history_weeks": "postgres: the history's weekly partitions (0025); SQLite keeps finished "
    "jobs in its jobs table",
    "job_history_move": "postgres: finished jobs from before the history move into it (0025); "
    "SQLite keeps finished jobs in its jobs table",
    "job_history_waiting": "postgres: what job_history_move has still to move",
    "job_history_drop": "postgres: a week of the history dropped whole (0025)",
    "job_relay_check": "postgres: a queue a broker holds records its jobs on PostgreSQL only "
    "(0016's relayed state and relay trigger); SQLite refuses such a queue's enqueue",
    "job_settle_relayed": "postgres: see job_relay_check",
    "job_relay_adopt": "postgres: see job_relay_check",
    "outbox_lease_settings": "postgres: planner settings for the outbox lease's transaction",
    "counter_compact": "postgres: counters are sharded by connection; SQLite has one writer and "
    "one shard",
}


def quote_schema(schema: str) -> str:
    """A schema name as a quoted identifier; only plain lowercase identifiers are accepted."""
    if not _IDENTIFIER_RE.fullmatch(schema):
        raise ConfigurationError(
            f"schema name {schema!r} must be a lowercase identifier (letters, digits, _)"
        )
    return f'"{schema}"'


def parse_blocks(text: str) -> dict[str, str]:
    """Split a queries file into {name: sql}; a name defined twice is an error."""
    matches = list(_NAME_RE.finditer(text))
    blocks: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        lines = [line for line in body.splitlines() if not line.startswith("--")]
        sql = "\n".join(lines).strip().rstrip(";").strip()
        if match.group(1) in blocks:
            raise ValueError(f"query {match.group(1)!r} is defined twice")
        blocks[match.group(1)] = sql
    return blocks


def _read(dialect: str, relative: str) -> str:
    return (resources.files("oncebox.store") / "sql" / dialect / relative).read_text("utf-8")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    checksum: str  # of the file as shipped, before the schema name is filled in


def query_files(dialect: str) -> list[str]:
    """The names of the dialect's query files, sorted."""
    folder = resources.files("oncebox.store") / "sql" / dialect
    return sorted(e.name for e in folder.iterdir() if e.name.endswith(".sql") and e.is_file())


def parse_files(texts: dict[str, str]) -> dict[str, str]:
    """{file name: text} into {name: sql}; a name defined twice, in one file or two, is an error."""
    blocks: dict[str, str] = {}
    where: dict[str, str] = {}
    for file, text in texts.items():
        for name, sql in parse_blocks(text).items():
            if name in blocks:
                raise ValueError(f"query {name!r} is defined twice: in {where[name]} and {file}")
            blocks[name], where[name] = sql, file
    return blocks


@functools.cache
def _queries(dialect: str) -> dict[str, str]:
    """The dialect's query files parsed, once per process: they are the package's own, and every
    store opened (a simulation opens one per world) would otherwise read and parse them again."""
    return parse_files({file: _read(dialect, file) for file in query_files(dialect)})


def load_queries(dialect: str, schema: str | None = None) -> dict[str, LiteralString]:
    """The dialect's named queries from all its query files, with the schema token resolved."""
    blocks = dict(_queries(dialect))
    if schema is not None:
        quoted = quote_schema(schema)
        blocks = {name: sql.replace(SCHEMA_TOKEN, quoted) for name, sql in blocks.items()}
    # The text comes from the package's own files; the only substitution is a validated,
    # quoted identifier. The library takes responsibility for these strings being literal SQL.
    return dict(blocks.items())


_MIGRATION_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def load_migrations(dialect: str, schema: str | None = None) -> list[Migration]:
    """The dialect's numbered migrations in order; numbering gaps or duplicates are an error."""
    folder = resources.files("oncebox.store") / "sql" / dialect / "migrations"
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _MIGRATION_RE.match(entry.name)
        if not match:
            continue
        raw = entry.read_text("utf-8")
        sql = raw.replace(SCHEMA_TOKEN, quote_schema(schema)) if schema is not None else raw
        digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:16]
        found.append(Migration(int(match.group(1)), match.group(2), sql, digest))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise ValueError(f"{dialect} migrations are not numbered 1..n: found {migration}")
    return found


def load_schema_snapshot(dialect: str, schema: str | None = None) -> str:
    """The schema a fully migrated database has, kept beside the migrations in
    `migrations/schema.sql` for review and tests."""
    text = _read(dialect, "migrations/schema.sql")
    return text.replace(SCHEMA_TOKEN, quote_schema(schema)) if schema is not None else text
