"""Fixtures shared by the whole suite.

PostgreSQL: `ONCEBOX_TEST_POSTGRES` names a server database to connect to (default the local
server's `test`). One template database is migrated per session; each test that needs PostgreSQL
gets its own database copied from it (`CREATE DATABASE … TEMPLATE …`), so tests with many
connections and processes are isolated. If the server is unreachable, PostgreSQL tests are
skipped with a loud reason — except under `CI=true` or `ONCEBOX_REQUIRE_POSTGRES=1`, where that
fails the run.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from oncebox import Box
from oncebox.store import open_store

PG_URL = os.environ.get("ONCEBOX_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
TEST_SECRET = "test-secret-not-for-production"
REQUIRE_PG = os.environ.get("CI", "").lower() == "true" or os.environ.get(
    "ONCEBOX_REQUIRE_POSTGRES"
) in {"1", "true", "yes"}
TESTS = Path(__file__).resolve().parent
STORY = pytest.StashKey[subprocess.Popen[bytes]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """pytest-xdist's controller starts the docs' story in the background when the run includes
    its tests (support/shared_story.py): the test processes then find the samples waiting."""
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    chosen = {Path(arg.split("::")[0]).resolve() for arg in config.args}
    if chosen & {TESTS, TESTS.parent, TESTS / "test_doc_samples.py"}:
        from support import shared_story

        story = shared_story.start(config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
        config.stash[STORY] = story


def pytest_sessionfinish(session: pytest.Session) -> None:
    story = session.config.stash.get(STORY, None)
    if story is not None:
        from support import shared_story

        shared_story.stop(story)


def _admin() -> psycopg.Connection:
    return psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)


def _url_for(database: str) -> str:
    base = psycopg.conninfo.conninfo_to_dict(PG_URL)
    base["dbname"] = database
    user = base.get("user")
    return "postgresql://" + (
        f"{f'{user}@' if user else ''}"
        f"{base.get('host', '127.0.0.1')}:{base.get('port', 5432)}/{database}"
    )


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    try:
        admin = _admin()
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL at {PG_URL} is unreachable: {str(exc).strip()}"
        if REQUIRE_PG:
            pytest.fail(message + " (required: CI=true or ONCEBOX_REQUIRE_POSTGRES=1)")
        pytest.skip("!!! SKIPPING POSTGRESQL TESTS !!! " + message)
    name = f"oncebox_tpl_{os.getpid()}"
    with admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"'.encode())
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
        store = open_store(_url_for(name), migrate=True)
        store.close()
        yield name
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@contextmanager
def database_from(template: str) -> Iterator[str]:
    """A new database copied from `template` (migrated, empty), dropped on exit; its URL."""
    name = f"oncebox_t_{uuid.uuid4().hex[:12]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'.encode())
        try:
            yield _url_for(name)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    with database_from(pg_template) as url:
        yield url


@pytest.fixture
def spans() -> Iterator[Any]:
    """The OpenTelemetry spans ended while the test runs, in the SDK's in-memory exporter
    (support/spans.py)."""
    from support.spans import recording  # the SDK only for the tests that trace

    with recording() as exporter:
        yield exporter


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'oncebox.db'}"


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def store_url(request: pytest.FixtureRequest) -> str:
    """Every store: the conformance suite runs once per dialect."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def box(store_url: str) -> Iterator[Box]:
    box = Box(store_url, seed=1234, secret=TEST_SECRET)
    try:
        yield box
    finally:
        box.close()


@pytest.fixture
def mail_box() -> Iterator[Callable[..., Box]]:
    """Builds boxes whose task writes one email per customer (support/outbox.py); closes them
    at teardown even when the test fails, so no provider connection outlives its test."""
    from support.outbox import mail_box as build

    built: list[Box] = []

    def make(url: str, provider: Any, **channel: Any) -> Box:
        box = build(url, provider, **channel)
        built.append(box)
        return box

    yield make
    for box in built:
        box.close()


@pytest.fixture
def open_box() -> Iterator[Callable[..., Box]]:
    """`Box(...)`, closed at teardown even when the test fails."""
    built: list[Box] = []

    def make(*args: Any, **kwargs: Any) -> Box:
        box = Box(*args, **kwargs)
        built.append(box)
        return box

    yield make
    for box in built:
        box.close()


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    """The tests' own SQS-compatible server (moto, FIFO dedupe as AWS's: `oncebox.fakes.sqs`),
    for the session."""
    from oncebox.fakes.sqs import sqs_server

    with sqs_server() as endpoint:
        yield endpoint
