"""oncebox's migrations applied from an Alembic revision: in the revision's transaction, recorded
where `oncebox migrate` records them, so either tool after the other applies nothing."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config

from conftest import database_from
from oncebox import Box
from oncebox.store.postgres import PostgresStore
from test_cli import oncebox

pytestmark = pytest.mark.postgres
APP = Path(__file__).resolve().parent / "support" / "alembic_app"


@pytest.fixture
def empty_db(pg_template: str):
    # a database without oncebox's tables: the template is migrated, so drop them first
    with database_from(pg_template) as url:
        with psycopg.connect(PostgresStore(url).conninfo, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
        yield url


def alembic(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(APP))
    config.set_main_option(
        "sqlalchemy.url",
        PostgresStore(url).conninfo.replace("postgresql://", "postgresql+psycopg://"),
    )
    return config


def test_an_alembic_upgrade_applies_oncebox_and_oncebox_migrate_then_applies_nothing(empty_db):
    command.upgrade(alembic(empty_db), "head")
    store = PostgresStore(empty_db)
    try:
        status = store.schema_status()
        assert status.applied == status.known
    finally:
        store.close()
    migrated = oncebox("migrate", "--db", empty_db)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("schema is up to date"), migrated.stdout
    box = Box(empty_db, secret="0123456789abcdef")
    try:

        @box.task(key="noop/{n}")
        def noop(ctx: object, n: int) -> None:
            pass

        assert box.enqueue(noop, n=1).created
    finally:
        box.close()


def test_a_revision_that_fails_after_oncebox_leaves_none_of_its_migrations(
    empty_db, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ALEMBIC_APP_FAIL", "1")
    with pytest.raises(RuntimeError, match="revision failed"):
        command.upgrade(alembic(empty_db), "head")
    with psycopg.connect(PostgresStore(empty_db).conninfo) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
    assert tables == (0,)
