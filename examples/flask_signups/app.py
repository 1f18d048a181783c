"""Sign-ups with Flask and sync SQLAlchemy: each new customer gets one welcome email.

The request inserts the customer and enqueues the welcome in one transaction
(`box.enqueue(..., connection=session)`): a sign-up the database refuses (an address already
registered) leaves no job. The handler marks the customer welcomed through the ORM
(`ctx.session`) and writes the email's outbox row, in the claim's transaction: a retried or
redelivered job cannot welcome anyone twice.

How to run it, from a clone to the welcome email (SQLite or PostgreSQL; the tables are created
at start-up): README.md beside this file.

Traced when `opentelemetry-instrumentation-flask` is installed: a sign-up's request, its welcome
job and the email form one trace (run both under `opentelemetry-instrument` to export it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flask import Flask, abort, request
from sqlalchemy import Engine, String, create_engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from oncebox import Box, JobContext


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    welcomed_at: Mapped[datetime | None]


@dataclass
class Signups:
    app: Flask
    box: Box
    engine: Engine


def sqlalchemy_url(url: str) -> str:
    """oncebox takes postgresql://…; SQLAlchemy names the driver: postgresql+psycopg://…"""
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def build(database_url: str) -> Signups:
    box = Box(database_url)
    box.use_sqlalchemy()
    engine = create_engine(sqlalchemy_url(database_url))
    Base.metadata.create_all(engine)

    @box.task(key="welcome/customer-{customer_id}")
    def welcome(ctx: JobContext, customer_id: int) -> None:
        customer = ctx.session.get(Customer, customer_id)
        if customer is None or customer.welcomed_at is not None:
            return
        customer.welcomed_at = ctx.now()
        ctx.outbox.email(
            to=customer.email, subject="Welcome aboard", text=f"Hello {customer.name}!"
        )

    app = Flask(__name__)
    trace_requests(app)

    @app.post("/customers")
    def sign_up() -> tuple[dict[str, Any], int]:
        body = request.get_json(force=True)
        try:
            with Session(engine) as session, session.begin():
                customer = Customer(email=str(body["email"]), name=str(body["name"]))
                session.add(customer)
                session.flush()  # its id, and the unique address checked before the enqueue
                job = box.enqueue(welcome, customer_id=customer.id, connection=session)
                customer_id = customer.id
        except IntegrityError:
            abort(409, "that address is already registered")
        except (KeyError, TypeError):
            abort(400, "give the new customer's email and name")
        return {"customer": customer_id, "welcome_job": job.job_id}, 201

    return Signups(app, box, engine)


def trace_requests(app: Flask) -> None:
    """A server span per request, when the instrumentation is installed; oncebox's enqueue
    span is its child, and the job and its email continue the same trace."""
    try:
        from opentelemetry.instrumentation.flask import FlaskInstrumentor  # noqa: PLC0415
    except ImportError:
        return
    FlaskInstrumentor().instrument_app(app)


if os.environ.get("SIGNUPS_DB"):  # flask --app …, oncebox worker --app …
    _signups = build(os.environ["SIGNUPS_DB"])
    app, box = _signups.app, _signups.box
