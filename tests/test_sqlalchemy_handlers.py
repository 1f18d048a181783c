"""Handlers that write through their ORM: `ctx.session` is a SQLAlchemy Session on the claim's
own connection, so the ORM's rows commit with the claim, the outbox rows and the job's completion
— or not at all — and the ORM cannot end that transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from conftest import TEST_SECRET
from oncebox import Box, JobContext, Retry
from oncebox.kernel.errors import ConfigurationError
from oncebox.testing import drain
from test_sqlalchemy_enqueue import engine_url

KEY = "hold-expired/hold-{}"


class Base(DeclarativeBase):
    pass


class Notice(Base):
    __tablename__ = "notices"
    id: Mapped[int] = mapped_column(primary_key=True)
    hold_id: Mapped[int] = mapped_column(unique=True)


@pytest.fixture
def app(store_url: str) -> Iterator[tuple[Box, sa.Engine]]:
    box = Box(store_url, secret=TEST_SECRET)
    engine = sa.create_engine(engine_url(box))
    Base.metadata.create_all(engine)
    try:
        yield box, engine
    finally:
        engine.dispose()
        box.close()


def notices(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(Notice.hold_id)).scalars())


def declare(box: Box, body) -> None:
    @box.task(key="hold-expired/hold-{hold_id}", retry=Retry(max_attempts=1))
    def expire(ctx: JobContext, hold_id: int) -> None:
        body(ctx, hold_id)


def test_orm_rows_commit_with_the_claim_and_the_message(app):
    box, engine = app
    box.use_sqlalchemy()

    def body(ctx: JobContext, hold_id: int) -> None:
        ctx.session.add(Notice(hold_id=hold_id))
        ctx.outbox.email(to=f"guest-{hold_id}@example.com", subject="expired", text="gone")

    declare(box, body)
    box.enqueue("expire", hold_id=1)
    assert drain(box, dispatch=False).completed == 1
    assert notices(engine) == [1]
    assert [m.key for m in box.store.outbox_find_by_key(KEY.format(1))] == [KEY.format(1)]


def test_a_handler_that_raises_after_orm_writes_leaves_no_row_no_intent_no_message(app):
    box, engine = app
    box.use_sqlalchemy()

    def body(ctx: JobContext, hold_id: int) -> None:
        ctx.session.add(Notice(hold_id=hold_id))
        ctx.session.flush()  # the row is in the claim's transaction
        ctx.outbox.email(to="guest@example.com", subject="expired", text="gone")
        raise RuntimeError("the template failed")

    declare(box, body)
    box.enqueue("expire", hold_id=1)
    result = drain(box, raise_on_failure=False, dispatch=False)
    assert result.dead == 1
    assert notices(engine) == []
    assert box.store.outbox_find_by_key(KEY.format(1)) == []
    assert box.store.intent_get(KEY.format(1)) is None


def test_one_failing_handler_in_a_batch_undoes_only_its_own_orm_rows(app):
    box, engine = app
    box.use_sqlalchemy()

    def body(ctx: JobContext, hold_id: int) -> None:
        ctx.session.add(Notice(hold_id=hold_id))
        if hold_id == 2:
            ctx.session.flush()
            raise RuntimeError("hold 2 fails")

    declare(box, body)
    box.enqueue_many("expire", [{"hold_id": h} for h in (1, 2, 3)])
    result = drain(box, raise_on_failure=False, dispatch=False)
    assert (result.completed, result.dead) == (2, 1)
    assert notices(engine) == [1, 3]


def test_an_orm_constraint_violation_fails_the_job_not_the_batch(app):
    box, engine = app
    box.use_sqlalchemy()
    with engine.begin() as conn:
        conn.execute(sa.insert(Notice).values(hold_id=2))

    def body(ctx: JobContext, hold_id: int) -> None:
        ctx.session.add(Notice(hold_id=hold_id))  # hold 2 exists: flushed when the handler returns

    declare(box, body)
    box.enqueue_many("expire", [{"hold_id": h} for h in (1, 2, 3)])
    result = drain(box, raise_on_failure=False, dispatch=False)
    assert (result.completed, result.dead) == (2, 1)
    assert "IntegrityError" in result.failures[0].error
    assert notices(engine) == [1, 2, 3]


@pytest.mark.parametrize(
    "end",
    [
        lambda s: s.commit(),
        lambda s: s.rollback(),
        lambda s: s.close(),
        lambda s: s.connection().commit(),
        lambda s: s.connection().rollback(),
        lambda s: s.connection().connection.dbapi_connection.commit(),
        lambda s: s.connection().connection.dbapi_connection.close(),
    ],
    ids=[
        "commit",
        "rollback",
        "close",
        "conn-commit",
        "conn-rollback",
        "dbapi-commit",
        "dbapi-close",
    ],
)
def test_the_orm_may_not_end_the_claims_transaction(app, end):
    box, engine = app
    box.use_sqlalchemy()

    def body(ctx: JobContext, hold_id: int) -> None:
        ctx.session.add(Notice(hold_id=hold_id))
        ctx.session.flush()
        end(ctx.session)

    declare(box, body)
    box.enqueue("expire", hold_id=1)
    result = drain(box, raise_on_failure=False, dispatch=False)
    assert result.dead == 1
    assert "TransactionControlRefused" in result.failures[0].error
    assert notices(engine) == []


def test_ctx_session_without_use_sqlalchemy_names_the_call(app):
    box, _engine = app
    seen: list[str] = []

    def body(ctx: JobContext, hold_id: int) -> None:
        try:
            ctx.session  # noqa: B018
        except ConfigurationError as exc:
            seen.append(str(exc))

    declare(box, body)
    box.enqueue("expire", hold_id=1)
    drain(box, dispatch=False)
    assert seen and "box.use_sqlalchemy()" in seen[0]


def test_session_options_reach_the_handlers_session(app):
    box, _engine = app
    box.use_sqlalchemy(info={"app": "bookings"}, autoflush=False)
    seen: list[object] = []

    def body(ctx: JobContext, hold_id: int) -> None:
        seen.append((ctx.session.info.get("app"), ctx.session.autoflush))

    declare(box, body)
    box.enqueue("expire", hold_id=1)
    drain(box, dispatch=False)
    assert seen == [("bookings", False)]
