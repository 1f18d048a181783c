"""A task's arguments as JSON Schema (2020-12): what a client in another language reads before
it enqueues, and what an HTTP API can serve for each task.

The schema is derived from the handler's signature, from the same annotations
`Task.check_args` enforces — `int`, `str`, `float`, `bool`, each optionally `| None` — so it
promises nothing the registry does not check, and the registry stays the judge of an enqueue.
A parameter with any other annotation (a list, a dataclass, none at all) is accepted as any JSON
value, as the registry accepts it, and its schema says so (`x-oncebox-unchecked`), rather than
inventing a shape nobody enforces. One difference of strictness is stated where it applies: JSON
Schema's `integer` admits `1.0`, which the registry refuses for an `int`.

The example uses the key guard's canary values — a parameter's own name for text, a number
derived from it for numbers — so it renders a key, and differs per parameter: a template that
swapped two placeholders would show it.
"""

from __future__ import annotations

import inspect
import zlib
from typing import Any

from oncebox.jobs.tasks import Task, annotation_text

DIALECT = "https://json-schema.org/draft/2020-12/schema"
_TYPES = {"int": "integer", "str": "string", "float": "number", "bool": "boolean"}
_INTEGER_NOTE = "an integer written without a fraction (1, not 1.0)"


def _number_for(name: str) -> int:
    return 1000 + zlib.crc32(name.encode()) % 9000


def _example_for(name: str, base: str) -> Any:
    if base == "int":
        return _number_for(name)
    if base == "float":
        return _number_for(name) + 0.5
    if base == "bool":
        return True
    return name


def _parameter(parameter: inspect.Parameter, text: str) -> tuple[dict[str, Any], Any]:
    """One parameter's schema, and its example value."""
    optional = text.endswith(" | None")
    base = text.removesuffix(" | None")
    kind = _TYPES.get(base)
    if kind is None:
        shown = text or "no annotation"
        schema: dict[str, Any] = {
            "description": f"any JSON value ({shown}: not checked before the handler runs)",
            "x-oncebox-unchecked": True,
        }
    else:
        schema = {"type": [kind, "null"] if optional else kind}
        if base == "int":
            schema["description"] = _INTEGER_NOTE
    default = parameter.default
    if default is not inspect.Parameter.empty and (
        default is None or isinstance(default, (bool, int, float, str))
    ):
        schema["default"] = default
    return schema, _example_for(parameter.name, base)


def task_schema(task: Task) -> dict[str, Any]:
    """The JSON Schema of `task`'s arguments (an object), with its key template and queue."""
    kinds = inspect.Parameter
    properties: dict[str, Any] = {}
    required: list[str] = []
    example: dict[str, Any] = {}
    by_name = [
        p
        for p in task.signature.parameters.values()
        if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
    ]
    for parameter in by_name:
        schema, value = _parameter(parameter, annotation_text(task.signature, parameter.name))
        properties[parameter.name] = schema
        if parameter.default is kinds.empty:
            required.append(parameter.name)
            example[parameter.name] = value
    takes_more = any(p.kind is kinds.VAR_KEYWORD for p in task.signature.parameters.values())
    found: dict[str, Any] = {
        "$schema": DIALECT,
        "title": task.name,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": takes_more,
        "examples": [example],
        "x-oncebox-queue": task.queue,
    }
    if task.key is not None:
        found["x-oncebox-key"] = task.key.source
    return found
