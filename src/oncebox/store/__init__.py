"""Stores: where jobs, intents and their history live. `open_store(url)` picks one.

URLs: `sqlite:///relative/path.db`, `sqlite:////absolute/path.db` (options:
`?synchronous=full|normal|extra&busy_timeout=SECONDS`), `postgresql://user@host:5432/db`
(options: `?schema=name&pool_min=N&pool_max=N&connect_timeout=SECONDS`, everything else goes to
libpq).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from oncebox.kernel.errors import ConfigurationError, NotFound
from oncebox.kernel.metrics import Metrics
from oncebox.kernel.url_options import number_option
from oncebox.store.protocol import Store

__all__ = ["Store", "open_store"]
_SCHEME_RE = re.compile(r"[a-z][a-z0-9+.-]*")


def open_store(
    url: str,
    *,
    metrics: Metrics | None = None,
    migrate: bool | None = None,
    must_exist: bool = False,
) -> Store:
    """Open the store a URL names. SQLite is migrated on open unless `migrate=False`, and its
    file created unless `must_exist` (operator commands: a mistyped path is an error, not a new
    empty database)."""
    scheme = url.split("://", 1)[0].lower() if isinstance(url, str) and "://" in url else ""
    if not _SCHEME_RE.fullmatch(scheme):  # the text is never echoed: it may hold a password
        raise ConfigurationError(
            "the database URL is not a URL (scheme://…): use sqlite:///path.db or "
            "postgresql://user@host:5432/db (keyword DSNs such as 'host=… dbname=…' are not "
            "accepted)"
        )
    if scheme == "sqlite":
        return _open_sqlite(
            url, metrics=metrics, migrate=migrate is not False, must_exist=must_exist
        )
    if scheme in {"postgresql", "postgres"}:
        from oncebox.store.postgres import PostgresStore

        store = PostgresStore(url, metrics=metrics)
        if migrate:
            store.schema_migrate()
        return store
    raise ConfigurationError(
        f"database URL scheme {scheme!r} is not supported: use sqlite:/// or postgresql://"
    )


def _open_sqlite(url: str, *, metrics: Metrics | None, migrate: bool, must_exist: bool) -> Store:
    from oncebox.store.sqlite import SqliteStore

    host_part = ConfigurationError(
        "SQLite URL has a host part (sqlite://HOST/…); write sqlite:///relative.db or "
        "sqlite:////absolute/path.db"
    )
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed '[' in the host part
        raise host_part from None
    if parts.netloc:
        raise host_part
    raw_path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not raw_path or raw_path == ":memory:":
        raise ConfigurationError(
            "SQLite URL needs a file path (an in-memory database cannot be shared by the "
            "worker's connections): e.g. sqlite:///oncebox.db"
        )
    if must_exist and not Path(raw_path).is_file():
        raise NotFound(f"no SQLite database at {Path(raw_path).resolve()}")
    options = dict(parse_qsl(parts.query))
    unknown = set(options) - {"synchronous", "busy_timeout"}
    if unknown:
        raise ConfigurationError(f"unknown SQLite URL option(s): {', '.join(sorted(unknown))}")
    busy = timedelta(
        seconds=number_option(options, "busy_timeout", 10.0, low=0, high=86_400, unit="seconds")
    )
    return SqliteStore(
        Path(raw_path),
        url=url,
        busy_timeout=busy,
        synchronous=options.get("synchronous", "full"),
        migrate=migrate,
        metrics=metrics,
    )
