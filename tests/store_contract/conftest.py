"""The store under test, for the contract files that call store operations directly
(`test_store_*.py`).

Those tests use one store at a time, mostly on one connection, so on PostgreSQL they share one
database per session, emptied before each test (a `TRUNCATE` costs a few milliseconds; a
database copied from the template for each of them would add about half a second apiece). A
test that needs a second store on the same database opens `store.url`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from conftest import database_from
from oncebox.kernel.clock import ClockSetting
from oncebox.store import Store, open_store
from support.contract import T0
from support.depths import depth_drift


@pytest.fixture(scope="session")
def pg_contract_url(pg_template: str) -> Iterator[str]:
    with database_from(pg_template) as url:
        yield url


def emptied(url: str) -> str:
    """Every oncebox table of the database at `url` emptied (the migrations' record kept)."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename LIKE 'oncebox%%' AND tablename <> 'oncebox_migrations'"
            )
        ]
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE".encode())
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty store of every dialect, its clock frozen at T0: a test moves time with
    the store's own clock setting, never by sleeping. After the test, the depths the triggers
    kept must equal a count of the rows: every operation the contract exercises keeps them."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'oncebox.db'}"
    else:
        url = emptied(request.getfixturevalue("pg_contract_url"))
    opened = open_store(url)
    opened.clock_set(ClockSetting(frozen_at=T0))
    try:
        yield opened
        assert depth_drift(url) == {}, "the depths drifted from the rows"
    finally:
        opened.close()
