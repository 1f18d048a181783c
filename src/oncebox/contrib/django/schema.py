"""oncebox's schema from `manage.py migrate`.

oncebox's own migrations table stays the one record of its schema version: the Django
migrations of this app only call oncebox's migrator, which applies what the database lacks (all
of it in one transaction) and records it where `oncebox migrate` does — so either command after
the other applies nothing. A later oncebox release that adds migrations ships a Django
migration that calls `migrate_schema` again. They are not atomic on Django's side (SQLite's
DDL cannot join a transaction oncebox's own connection does not share, and oncebox's migrator
is one transaction and idempotent itself): a `migrate` cut short between the two simply runs
the call again, which then applies nothing.
"""

from __future__ import annotations

from typing import Any


def migrate_schema(_apps: Any, schema_editor: Any) -> None:
    """A RunPython step: oncebox's pending migrations, on the alias oncebox lives in."""
    from oncebox.contrib.django.conf import read_settings  # noqa: PLC0415
    from oncebox.contrib.django.project import get_box  # noqa: PLC0415 (Django must be set up)

    if schema_editor.connection.alias != read_settings().alias:
        return  # another database of the project: oncebox's tables are not there
    store = get_box().store
    if store.dialect == "sqlite":
        store.schema_migrate()  # on oncebox's own connection: SQLite's DDL commits by itself
    else:
        store.schema_migrate(connection=schema_editor.connection)


def refuse_reverse(_apps: Any, _schema_editor: Any) -> None:
    from oncebox.kernel.errors import ConfigurationError  # noqa: PLC0415

    raise ConfigurationError("oncebox's migrations are additive: its tables are kept")
