"""A task's arguments as JSON Schema: it states what the registry checks and nothing more — a
value the schema admits is one an enqueue accepts, and the reverse — says where it cannot, and
carries an example that renders the task's key."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebox import Box, InvalidArguments, JobContext
from oncebox.jobs.schemas import task_schema
from oncebox.jobs.tasks import Task


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Box:
    made = Box(f"sqlite:///{tmp_path_factory.mktemp('schemas') / 'oncebox.db'}")

    @made.task(key="weekly-digest/customer-{customer_id}/{period}", queue="digests")
    def weekly_digest(
        ctx: JobContext,
        customer_id: int,
        period: str,
        weight_kg: float | None = None,
        urgent: bool = False,
    ) -> None:
        pass

    @made.task(key="import/{batch}")
    def bulk_import(ctx: JobContext, batch: str, rows: list[int], raw) -> None:
        pass

    @made.task(key="hook/{event}")
    def hook(ctx: JobContext, event: str, **payload: Any) -> None:
        pass

    return made


def accepts(task: Task, args: dict[str, Any]) -> bool:
    try:
        task.check_args(args)
    except InvalidArguments:
        return False
    return True


def test_a_tasks_schema_states_its_checked_arguments_key_and_queue(box: Box):
    task = box.registry.get("weekly_digest")
    schema = task_schema(task)

    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["customer_id"]["type"] == "integer"
    assert schema["properties"]["period"] == {"type": "string"}
    assert schema["properties"]["weight_kg"] == {"type": ["number", "null"], "default": None}
    assert schema["properties"]["urgent"] == {"type": "boolean", "default": False}
    assert schema["required"] == ["customer_id", "period"]
    assert schema["additionalProperties"] is False
    assert (schema["x-oncebox-key"], schema["x-oncebox-queue"]) == (
        "weekly-digest/customer-{customer_id}/{period}",
        "digests",
    )
    [example] = schema["examples"]
    jsonschema.validate(example, schema)
    assert accepts(task, example)
    assert task.render_key(example) == f"weekly-digest/customer-{example['customer_id']}/period"


def test_an_argument_the_registry_does_not_check_is_said_unchecked(box: Box):
    schema = task_schema(box.registry.get("bulk_import"))

    assert schema["properties"]["batch"] == {"type": "string"}
    for name, shown in (("rows", "list[int]"), ("raw", "no annotation")):
        unchecked = schema["properties"][name]
        assert unchecked["x-oncebox-unchecked"] is True and "type" not in unchecked
        assert shown in unchecked["description"]
    jsonschema.validate({"batch": "b", "rows": "anything", "raw": {"x": [1]}}, schema)


def test_a_handler_taking_keyword_arguments_admits_others(box: Box):
    task = box.registry.get("hook")
    schema = task_schema(task)

    assert schema["additionalProperties"] is True
    args = {"event": "signup", "plan": "pro", "seats": 3}
    jsonschema.validate(args, schema)
    assert accepts(task, args)


def test_an_integral_float_for_an_int_is_refused_though_json_schema_admits_it(box: Box):
    """The one difference of strictness, said in the parameter's description."""
    task = box.registry.get("weekly_digest")
    schema = task_schema(task)

    jsonschema.validate({"customer_id": 7.0, "period": "2026-W49"}, schema)
    assert not accepts(task, {"customer_id": 7.0, "period": "2026-W49"})
    assert "not 1.0" in schema["properties"]["customer_id"]["description"]


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer())
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=5,
)


@pytest.fixture(scope="module")
def digest(box: Box) -> Task:
    return box.registry.get("weekly_digest")


@settings(max_examples=300, deadline=None)
@given(
    args=st.dictionaries(
        st.sampled_from(["customer_id", "period", "weight_kg", "urgent", "other"]), JSON_VALUES
    )
)
def test_the_schema_admits_exactly_what_the_registry_accepts(digest: Task, args: dict[str, Any]):
    """Integral floats left out: the one difference, pinned above."""
    valid = jsonschema.Draft202012Validator(task_schema(digest)).is_valid(args)
    assert valid == accepts(digest, args)
