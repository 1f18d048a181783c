"""The records the consumer builds once per job through a builder of their own (a frozen
dataclass's `__init__` costs twice as much): each builder makes exactly what the constructor
makes, every field in its place."""

from __future__ import annotations

import dataclasses
import inspect
from datetime import UTC, datetime
from typing import Any

import pytest

from oncebox.queue.context import JobContext, job_context
from oncebox.queue.transport import Delivery, leased_delivery


def distinct_values(cls: type) -> list[Any]:
    """One value per field, no two alike, so that two fields swapped would show."""
    return [object() for _ in dataclasses.fields(cls)]


def test_a_leased_delivery_is_the_delivery_its_constructor_makes():
    values = distinct_values(Delivery)
    built = leased_delivery(*values)
    assert built == Delivery(*values)
    assert len(inspect.signature(leased_delivery).parameters) == len(values)
    assert isinstance(built, Delivery)
    real = leased_delivery(
        "7", "digest", '{"n": 1}', "k/1", 2, 3, datetime(2026, 1, 1, tzinfo=UTC), None, 7, "t", None
    )
    assert real == Delivery(
        message_id="7",
        task="digest",
        args_json='{"n": 1}',
        key="k/1",
        attempt=2,
        attempts_left=3,
        leased_at=datetime(2026, 1, 1, tzinfo=UTC),
        job_id=7,
        lease_token="t",
    )


def test_a_job_context_is_the_context_its_constructor_makes():
    values = distinct_values(JobContext)
    built = job_context(*values)
    assert built == JobContext(*values)
    assert len(inspect.signature(job_context).parameters) == len(values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.key = "other"  # type: ignore[misc]
