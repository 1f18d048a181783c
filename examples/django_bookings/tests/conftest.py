"""pytest-django with oncebox: the outbox secret stored once in the test database (a worker
stores it at start; `drain` runs handlers without one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from oncebox.contrib.django import box


@pytest.fixture(scope="session", autouse=True)
def outbox_secret(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    with django_db_blocker.unblock():
        box.ensure_secret()
    yield
    box.close()
