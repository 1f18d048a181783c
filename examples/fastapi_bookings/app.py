"""Room holds with FastAPI and async SQLAlchemy: a hold placed by a request expires fifteen
minutes later — once — and its guest is emailed once.

The request writes the hold and enqueues its expiry in one transaction (`box.aio.enqueue(...,
connection=session)`): a request that fails after the enqueue leaves neither. The handler runs
in the claim's transaction and writes through the ORM (`ctx.session`): the hold's new state, the
intent and the email's outbox row commit together, so a retry or a redelivery cannot expire a
hold twice or email its guest twice.

How to run it, from a clone to the guest's email (PostgreSQL; the tables are created at
start-up): README.md beside this file.

Traced when `opentelemetry-instrumentation-fastapi` is installed: a hold's request, its expiry
job and the guest's email form one trace (run both under `opentelemetry-instrument` to export
it).
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import CheckConstraint, String, create_engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from oncebox import Box, JobContext

HOLD_FOR = timedelta(minutes=15)


class Base(DeclarativeBase):
    pass


class Hold(Base):
    __tablename__ = "holds"
    __table_args__ = (CheckConstraint("nights BETWEEN 1 AND 30", name="holds_nights"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    guest_email: Mapped[str] = mapped_column(String(320))
    nights: Mapped[int]
    state: Mapped[str] = mapped_column(String(16), default="held")


class HoldIn(BaseModel):
    id: int = Field(gt=0)
    guest_email: str = Field(max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")
    nights: int  # the table checks the range: a request the database refuses


@dataclass
class Bookings:
    app: FastAPI
    box: Box
    engine: AsyncEngine


def sqlalchemy_url(url: str) -> str:
    """oncebox takes postgresql://…; SQLAlchemy names the driver: postgresql+psycopg://…"""
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def build(database_url: str) -> Bookings:
    box = Box(database_url)
    box.use_sqlalchemy()

    @box.task(key="hold-expired/hold-{hold_id}")
    def expire_hold(ctx: JobContext, hold_id: int) -> None:
        hold = ctx.session.get(Hold, hold_id)
        if hold is None or hold.state != "held":
            return  # confirmed or cancelled meanwhile: nothing to expire
        hold.state = "expired"
        ctx.outbox.email(
            to=hold.guest_email,
            subject="Your room hold has expired",
            text=f"Hold {hold.id} for {hold.nights} night(s) has expired.",
        )

    engine = create_async_engine(sqlalchemy_url(database_url))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> Any:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        yield
        await engine.dispose()

    app = FastAPI(lifespan=lifespan)
    trace_requests(app)

    @app.post("/holds", status_code=201)
    async def place_hold(body: HoldIn) -> dict[str, Any]:
        try:
            async with AsyncSession(engine) as session, session.begin():
                session.add(Hold(id=body.id, guest_email=body.guest_email, nights=body.nights))
                expiry = await box.aio.enqueue(
                    expire_hold, hold_id=body.id, delay=HOLD_FOR, connection=session
                )
                await session.flush()  # the table's checks: a refusal rolls back the enqueue too
        except IntegrityError as refused:
            if "holds_nights" in str(refused.orig):
                raise HTTPException(422, "the hold was refused: nights must be 1 to 30") from None
            raise HTTPException(409, f"hold {body.id} was already placed") from None
        return {"hold": body.id, "expiry_job": expiry.job_id, "created": expiry.created}

    @app.get("/holds/{hold_id}")
    async def hold_status(hold_id: int) -> dict[str, Any]:
        async with AsyncSession(engine) as session:
            hold = await session.get(Hold, hold_id)
        if hold is None:
            raise HTTPException(404, "no such hold")
        chain = await box.aio.receipts(f"hold-expired/hold-{hold_id}")
        return {
            "hold": hold_id,
            "state": hold.state,
            "expiry": [receipt.job.state for receipt in chain.jobs],
            "emails": [message.message.state for message in chain.messages],
        }

    return Bookings(app, box, engine)


def trace_requests(app: FastAPI) -> None:
    """A server span per request, when the instrumentation is installed; oncebox's enqueue
    span is its child (`box.aio` carries the request's context to the thread that enqueues),
    and the job and its email continue the same trace."""
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor  # noqa: PLC0415
    except ImportError:
        return
    FastAPIInstrumentor.instrument_app(app)


def create_tables(database_url: str) -> None:
    """For the worker's side and tests: the app's tables, created if missing."""
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        Base.metadata.create_all(engine)
    finally:
        engine.dispose()


if os.environ.get("BOOKINGS_DB"):  # uvicorn …:app, oncebox worker --app …
    _bookings = build(os.environ["BOOKINGS_DB"])
    app, box = _bookings.app, _bookings.box
