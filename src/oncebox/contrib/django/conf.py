"""`settings.ONCEBOX`: which of Django's databases oncebox lives in, and the rest of what a
plain Box reads from its environment.

    ONCEBOX = {
        "DATABASE": "default",       # the alias in DATABASES (PostgreSQL or SQLite)
        "SCHEMA": "public",          # PostgreSQL: the schema of oncebox's tables
        "SECRET": None,              # else ONCEBOX_SECRET, else the one stored in the database
        "EMAIL": None,               # the `email` channel's provider URL, else ONCEBOX_EMAIL
        "OPTIONS": {},               # oncebox's own URL options (pool_max, busy_timeout, ...)
        "TASKS": None,               # modules declaring tasks; None: each app's `tasks` module
    }

Every key is optional. The URL is derived from the alias's settings when the store is first used
— after Django's test runner has renamed the test database — never written twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from oncebox.kernel.errors import ConfigurationError

_KNOWN = frozenset({"DATABASE", "SCHEMA", "SECRET", "EMAIL", "OPTIONS", "TASKS"})
# what of a PostgreSQL alias's OPTIONS libpq understands in a URL; the rest is Django's own
_LIBPQ = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "target_session_attrs",
        "application_name",
        "connect_timeout",
        "options",
        "passfile",
        "service",
    }
)


@dataclass(frozen=True)
class OnceboxSettings:
    alias: str = "default"
    schema: str | None = None
    secret: str | None = None
    email: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    tasks: tuple[str, ...] | None = None


def read_settings() -> OnceboxSettings:
    """`settings.ONCEBOX`, checked: a typo is named, not ignored."""
    from django.conf import settings  # noqa: PLC0415 (Django is optional)

    given: Any = getattr(settings, "ONCEBOX", {}) or {}
    if not isinstance(given, dict):
        raise ConfigurationError("settings.ONCEBOX must be a dict")
    unknown = sorted(set(given) - _KNOWN)
    if unknown:
        raise ConfigurationError(
            f"settings.ONCEBOX has unknown key(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_KNOWN))})"
        )
    alias = given.get("DATABASE", "default")
    if alias not in settings.DATABASES:
        raise ConfigurationError(
            f"settings.ONCEBOX['DATABASE'] is {alias!r}, which is not in DATABASES"
        )
    tasks = given.get("TASKS")
    options = given.get("OPTIONS") or {}
    if not isinstance(options, dict):
        raise ConfigurationError("settings.ONCEBOX['OPTIONS'] must be a dict of URL options")
    return OnceboxSettings(
        alias=alias,
        schema=given.get("SCHEMA"),
        secret=given.get("SECRET"),
        email=given.get("EMAIL"),
        options={str(k): str(v) for k, v in options.items()},
        tasks=None if tasks is None else tuple(tasks),
    )


def database_url(database: dict[str, Any], ours: OnceboxSettings) -> str:
    """The oncebox URL of one of Django's databases, as its settings are now."""
    engine = str(database.get("ENGINE", ""))
    query: dict[str, str] = {}
    if engine.endswith("postgresql"):
        user = quote(str(database.get("USER") or ""), safe="")
        password = quote(str(database.get("PASSWORD") or ""), safe="")
        host = str(database.get("HOST") or "")
        port = str(database.get("PORT") or "")
        if host.startswith("/"):  # a socket directory
            query["host"], host = host, ""
        userinfo = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        netloc = userinfo + host + (f":{port}" if port else "")
        options = database.get("OPTIONS") or {}
        for name, value in options.items():
            if name in _LIBPQ and isinstance(value, str | int):
                query[name] = str(value)
        # as Django's own connections: no prepared statements unless OPTIONS turns them on (so
        # a project behind PgBouncer in transaction pooling works as its views do)
        threshold = options.get("prepare_threshold")
        query["prepare_threshold"] = "none" if threshold is None else str(threshold)
        if ours.schema:
            query["schema"] = ours.schema
        query.update(ours.options)
        name = quote(str(database.get("NAME") or ""), safe="")
        return f"postgresql://{netloc}/{name}" + (f"?{urlencode(query)}" if query else "")
    if engine.endswith("sqlite3"):
        name = str(database.get("NAME") or "")
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ConfigurationError(
                f"Django's database {name or '(unnamed)'!r} is in memory: oncebox needs a "
                "SQLite file its worker can open too (give NAME, and TEST['NAME'] for tests)"
            )
        query.update(ours.options)
        path = Path(name.removeprefix("file:")).absolute()
        return f"sqlite:///{path}" + (f"?{urlencode(query)}" if query else "")
    raise ConfigurationError(
        f"oncebox runs on Django's PostgreSQL (psycopg 3) and SQLite backends, not {engine!r}"
    )
