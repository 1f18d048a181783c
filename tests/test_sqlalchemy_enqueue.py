"""Enqueue in the caller's SQLAlchemy transaction: the job commits or rolls back with the ORM's
rows, on both stores, whether the caller hands over a Session or a Connection, begun or not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from oncebox import Box
from oncebox.kernel.errors import ConfigurationError
from oncebox.store.postgres import PostgresStore
from oncebox.store.sqlite import SqliteStore
from support.apps import digest_box

KEY = "weekly-digest/customer-{}/2026-W33"


class Base(DeclarativeBase):
    pass


class Booking(Base):
    __tablename__ = "bookings"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer_id: Mapped[int]


def engine_url(box: Box) -> str:
    """The box's own database, as SQLAlchemy names it (psycopg 3 on PostgreSQL)."""
    if isinstance(box.store, SqliteStore):
        return f"sqlite:///{box.store.path}"
    assert isinstance(box.store, PostgresStore)
    return box.store.conninfo.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def app(store_url: str) -> Iterator[tuple[Box, sa.Engine]]:
    box = digest_box(store_url)
    engine = sa.create_engine(engine_url(box))
    Base.metadata.create_all(engine)
    try:
        yield box, engine
    finally:
        engine.dispose()
        box.close()


def jobs_for(box: Box, *customers: int) -> list[int]:
    return [c for c in customers if box.store.job_find_by_key(KEY.format(c))]


def enqueue(box: Box, customer: int, connection: object) -> None:
    task = box.registry.get("weekly_digest")
    box.enqueue(task, customer_id=customer, period="2026-W33", connection=connection)


def test_a_session_that_commits_keeps_its_rows_and_its_job(app):
    box, engine = app
    with Session(engine) as session:
        session.add(Booking(id=1, customer_id=1))
        enqueue(box, 1, session)
        session.commit()
    assert jobs_for(box, 1) == [1]
    with Session(engine) as session:
        assert session.get(Booking, 1) is not None


def test_a_session_that_rolls_back_leaves_no_row_and_no_job(app):
    box, engine = app
    with Session(engine) as session:
        session.add(Booking(id=1, customer_id=1))
        session.flush()
        enqueue(box, 1, session)
        session.rollback()
    assert jobs_for(box, 1) == []
    with Session(engine) as session:
        assert session.get(Booking, 1) is None


def test_a_session_that_raises_inside_begin_leaves_no_job(app):
    box, engine = app
    with (
        pytest.raises(RuntimeError, match="the request failed"),
        Session(engine) as session,
        session.begin(),
    ):
        enqueue(box, 1, session)
        raise RuntimeError("the request failed")
    assert jobs_for(box, 1) == []


def test_a_connection_that_has_not_begun_commits_the_job_with_its_own_commit(app):
    # enqueue is the first thing on the connection: SQLAlchemy must know its transaction began,
    # or its commit does nothing and the job vanishes when the connection goes back to the pool
    box, engine = app
    with engine.connect() as conn:
        enqueue(box, 1, conn)
        conn.commit()
    assert jobs_for(box, 1) == [1]


def test_a_connection_that_closes_without_commit_leaves_no_job(app):
    box, engine = app
    with engine.connect() as conn:
        enqueue(box, 1, conn)
    assert jobs_for(box, 1) == []


def test_many_jobs_commit_and_roll_back_with_the_session(app):
    box, engine = app
    task = box.registry.get("weekly_digest")
    with Session(engine) as session:
        result = box.enqueue_many(
            task, [{"customer_id": c, "period": "2026-W33"} for c in (1, 2)], connection=session
        )
        assert result.created == 2
        session.rollback()
    assert jobs_for(box, 1, 2) == []
    with Session(engine) as session, session.begin():
        box.enqueue_many(
            task, [{"customer_id": c, "period": "2026-W33"} for c in (1, 2, 3)], connection=session
        )
    assert jobs_for(box, 1, 2, 3) == [1, 2, 3]


def test_a_bad_job_among_many_writes_nothing_and_leaves_the_callers_transaction_usable(app):
    box, engine = app
    task = box.registry.get("weekly_digest")
    rows = [{"customer_id": 1, "period": "2026-W33"}, {"customer_id": "not a number"}]
    with Session(engine) as session:
        session.add(Booking(id=7, customer_id=7))
        with pytest.raises(Exception, match="period"):
            box.enqueue_many(task, rows, connection=session)
        session.commit()
    assert jobs_for(box, 1) == []
    with Session(engine) as session:
        assert session.get(Booking, 7) is not None


def test_an_engine_is_refused_with_what_to_pass_instead(app):
    box, engine = app
    with pytest.raises(ConfigurationError, match=r"Engine.*Connection.*Session"):
        enqueue(box, 1, engine)


@pytest.mark.postgres
def test_a_psycopg2_connection_is_refused_naming_psycopg_3(pg_url):
    import psycopg2  # type: ignore[import-untyped]

    box = digest_box(pg_url)
    conn = psycopg2.connect(PostgresStore(pg_url).conninfo)
    try:
        with pytest.raises(ConfigurationError, match=r"psycopg2.*psycopg 3.*postgresql\+psycopg"):
            enqueue(box, 1, conn)
    finally:
        conn.close()
        box.close()


def test_async_objects_are_sent_to_the_awaitable_surface(sqlite_url):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    box = digest_box(sqlite_url)
    # never connected: the refusal comes first
    async_engine = create_async_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    try:
        with pytest.raises(ConfigurationError, match=r"AsyncEngine.*no transaction"):
            enqueue(box, 1, async_engine)
        with pytest.raises(ConfigurationError, match=r"AsyncSession.*await box\.aio\.enqueue"):
            enqueue(box, 1, AsyncSession(async_engine))
    finally:
        async_engine.sync_engine.dispose()
        box.close()
