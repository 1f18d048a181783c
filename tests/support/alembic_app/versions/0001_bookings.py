"""The app's own table, then oncebox's schema, in one revision."""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import op

from oncebox.alembic import upgrade as oncebox_upgrade

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table("bookings", sa.Column("id", sa.Integer, primary_key=True))
    oncebox_upgrade()
    if os.environ.get("ALEMBIC_APP_FAIL"):  # the revision fails after oncebox's migrations
        raise RuntimeError("the revision failed after oncebox's migrations")


def downgrade() -> None:
    raise RuntimeError("oncebox's migrations are additive: keep its tables")
