"""`?schema=` on every path that writes on the caller's connection: a SQLAlchemy Session, an
async connection through `box.aio`, and Alembic's upgrade all write into the box's schema, not
into whatever the caller's search_path finds first."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from conftest import TEST_SECRET
from oncebox.alembic import upgrade
from oncebox.store import open_store
from oncebox.store.postgres import PostgresStore
from support.apps import digest_box

pytestmark = pytest.mark.postgres


def keys_in(conninfo: str, schema: str) -> list[str]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(f'SELECT key FROM "{schema}".oncebox_all_jobs ORDER BY key').fetchall()
    return [row[0] for row in rows]


def test_caller_connections_write_into_the_boxs_schema(pg_url: str):
    url = f"{pg_url}?schema=tenant_a"
    open_store(url, migrate=True).close()
    conninfo = PostgresStore(pg_url).conninfo
    box = digest_box(url, secret=TEST_SECRET)
    engine = sa.create_engine(conninfo.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as session, session.begin():
            box.enqueue("weekly_digest", customer_id=1, period="p", connection=session)

        async def request() -> None:
            async with await psycopg.AsyncConnection.connect(conninfo) as conn:
                await box.aio.enqueue("weekly_digest", customer_id=2, period="p", connection=conn)
                await conn.commit()

        asyncio.run(request())
    finally:
        engine.dispose()
        box.close()
    expected = ["weekly-digest/customer-1/p", "weekly-digest/customer-2/p"]
    assert keys_in(conninfo, "tenant_a") == expected
    assert keys_in(conninfo, "public") == []  # the search_path's first schema has the tables too


def test_alembic_upgrade_migrates_the_schema_it_is_given(pg_url: str):
    conninfo = PostgresStore(pg_url).conninfo
    engine = sa.create_engine(conninfo.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            applied = upgrade("tenant_b", connection=conn)
    finally:
        engine.dispose()
    status_store = PostgresStore(f"{pg_url}?schema=tenant_b")
    try:
        status = status_store.schema_status()
    finally:
        status_store.close()
    assert applied == list(status.known) and status.applied == status.known
