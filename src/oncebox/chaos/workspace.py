"""The database a chaos run works in: always one it creates for the run, and drops after.

The harness kills workers, drops connections and rewrites queries; it must never do that to a
database someone cares about. Given a PostgreSQL URL it creates a new database on that server
(`oncebox_chaos_<random>`) and drops it at the end, forcing out any connection a killed worker
left; given nothing, or a SQLite URL, it uses a new file in a temporary directory. The URL the
user gave is only ever used to reach the server.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from oncebox.kernel.errors import ConfigurationError, StoreUnavailable
from oncebox.kernel.inert import redact
from oncebox.store import open_store
from oncebox.store.postgres import split_url


@contextmanager
def workspace(server: str | None) -> Iterator[str]:
    """Yield the URL of a fresh, migrated database for one run; remove it afterwards."""
    scheme = (server or "sqlite://").split("://", 1)[0].lower()
    if scheme == "sqlite":
        with _sqlite_workspace() as url:
            yield url
    elif scheme in {"postgresql", "postgres"}:
        with _postgres_workspace(server or "") as url:
            yield url
    else:
        raise ConfigurationError(
            f"database URL scheme {scheme!r} is not supported: use postgresql://host/db "
            "(a database is created on that server for the run) or nothing (a temporary SQLite "
            "file)"
        )


@contextmanager
def _sqlite_workspace() -> Iterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="oncebox-chaos-"))
    try:
        url = f"sqlite:///{folder / 'chaos.db'}"
        open_store(url).close()  # created and migrated
        yield url
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _postgres_workspace(server: str) -> Iterator[str]:
    conninfo, _options = split_url(server)
    name = f"oncebox_chaos_{uuid.uuid4().hex[:12]}"
    _admin(server, conninfo, f'CREATE DATABASE "{name}"', "create a database for the run on")
    try:
        url = _with_database(server, name)
        open_store(url, migrate=True).close()
        yield url
    finally:
        # a connection of its own: a scenario may have restarted the server meanwhile
        _admin(
            server, conninfo, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f"drop {name} on"
        )


def _admin(server: str, conninfo: str, statement: str, doing: str) -> None:
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as admin:
            admin.execute(statement.encode())
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(
            f"cannot reach PostgreSQL at {redact(server)}: {_first_line(exc)}"
        ) from None
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"cannot {doing} {redact(server)} (the harness never works in an existing "
            f"database): {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _with_database(server: str, name: str) -> str:
    """The server's URL naming another database, as text (urlunsplit would drop the `//` of a
    host-less `postgresql:///db?host=…` URL); the query's libpq options are kept."""
    scheme, rest = server.split("://", 1)
    authority, _, path_and_query = rest.partition("/")
    _path, _, query = path_and_query.partition("?")
    kept = "&".join(p for p in query.split("&") if p and not p.startswith("schema="))
    return f"{scheme}://{authority}/{name}" + (f"?{kept}" if kept else "")
