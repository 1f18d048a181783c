"""oncebox's schema inside an Alembic history.

A team whose schema lives in Alembic wants one command to bring a database up to date, and one
record of what is applied. Call `upgrade()` from a revision's `upgrade()`: oncebox's migrations
not yet applied run in that revision's transaction (PostgreSQL's DDL is transactional, so a
revision that fails later leaves none of them), and each is recorded where `oncebox migrate`
records it — oncebox's own migrations table stays the one source of truth for oncebox's schema
version, whichever tool applied it. Running it again, from a later revision or after `oncebox
migrate`, applies nothing. A later oncebox release brings new migrations: add a revision that
calls `upgrade()` again.

    # alembic/versions/xxxx_oncebox.py
    from oncebox.alembic import upgrade as oncebox_upgrade

    def upgrade() -> None:
        oncebox_upgrade()          # schema="public" unless the app's URL says ?schema=

    def downgrade() -> None:
        raise RuntimeError("oncebox's migrations are additive: keep its tables")

On SQLite there is nothing to do: a Box migrates the file when it opens it (SQLite's DDL would
commit on its own, outside the revision's transaction).

Migrations set a local lock timeout (a busy table fails the revision instead of hanging it);
it lasts until the revision's transaction ends.
"""

from __future__ import annotations

from typing import Any

from oncebox.kernel.errors import ConfigurationError
from oncebox.store.postgres import PostgresStore


def upgrade(schema: str = "public", *, connection: Any = None) -> list[int]:
    """Apply oncebox's pending migrations in the current Alembic revision's transaction (or on
    `connection`, a SQLAlchemy Connection); the versions applied now."""
    if connection is None:
        from alembic import op  # noqa: PLC0415 (optional: only where Alembic runs this)

        connection = op.get_bind()
    dialect = connection.dialect.name
    if dialect == "sqlite":
        return []  # a Box migrates the file when it opens it
    if dialect != "postgresql":
        raise ConfigurationError(f"oncebox runs on PostgreSQL or SQLite, not {dialect}")
    url = connection.engine.url.set(drivername="postgresql", query={})
    store = PostgresStore(f"{url.render_as_string(hide_password=False)}?schema={schema}")
    try:
        return store.schema_migrate(connection=connection)
    finally:
        store.close()
