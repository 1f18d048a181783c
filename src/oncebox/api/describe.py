"""The API describing itself, from the same endpoints the router serves and the task registry:
`GET /openapi.json` (OpenAPI 3.1, whose schema dialect is JSON Schema 2020-12 — each task's
arguments are `jobs/schemas.task_schema`, one path per task, with an example rendered from the
key guard's canary values) and `GET /v1/discovery/{capability}`: one operation's request and
response schemas and a runnable example, in curl and in Python's standard library.

A task's enqueue is described under its own path (`/v1/tasks/weekly_digest/jobs`) so that a
client, or a generated one, sees each task's arguments; the router serves the template.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from oncebox import __version__
from oncebox.api.guard import Endpoint
from oncebox.api.jobs import MAX_BATCH, MAX_DELAY
from oncebox.api.problems import MEDIA_TYPE, TITLES, TYPE_PREFIX
from oncebox.box import Box
from oncebox.jobs.schemas import task_schema
from oncebox.jobs.tasks import Task

_ANY: dict[str, Any] = {"type": "object"}
PROBLEM = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "enum": [TYPE_PREFIX + kind for kind in TITLES]},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
    },
}
_LINKS = {"type": "object", "additionalProperties": {"type": "string"}}
_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
ENQUEUED = {
    "type": "object",
    "required": ["task", "created", "job_id", "key", "state", "reason", "summary", "links"],
    "properties": {
        "task": {"type": "string"},
        "created": {"type": "boolean"},
        "job_id": _NULLABLE_INT,
        "key": _NULLABLE_STR,
        "state": {"type": "string"},
        "reason": _NULLABLE_STR,
        "summary": {"type": "string"},
        "links": _LINKS,
    },
}
BATCH = {
    "type": "object",
    "required": ["task", "created", "skipped", "job_ids"],
    "properties": {
        "task": {"type": "string"},
        "created": {"type": "integer"},
        "skipped": {"type": "integer"},
        "job_ids": {"type": "array", "items": {"type": "integer"}},
    },
}
JOB = {
    "type": "object",
    "required": ["job", "links"],
    "properties": {
        "job": {
            "type": "object",
            "required": ["id", "key", "task", "state", "attempt"],
            "properties": {
                "id": {"type": "integer"},
                "key": _NULLABLE_STR,
                "task": {"type": "string"},
                "state": {"type": "string"},
                "attempt": {"type": "integer"},
            },
        },
        "links": _LINKS,
    },
}
RECEIPTS = {
    "type": "object",
    "required": ["key", "intent", "jobs", "messages", "audit"],
    "properties": {
        "key": {"type": "string"},
        "intent": {"type": ["object", "null"]},
        "jobs": {"type": "array", "items": _ANY},
        "messages": {"type": "array", "items": _ANY},
        "audit": {"type": "array", "items": _ANY},
    },
}
SCHEDULE = {
    "type": "object",
    "required": ["name", "paused", "last_fire_at", "slo", "periods"],
    "properties": {
        "name": {"type": "string"},
        "paused": {"type": "boolean"},
        "last_fire_at": _NULLABLE_STR,
        "slo": {"type": ["object", "null"]},
        "periods": {"type": "array", "items": _ANY},
    },
}
PERIODS = {
    "type": "object",
    "required": ["schedules"],
    "properties": {"schedules": {"type": "array", "items": SCHEDULE}},
}
PERIOD = {
    "type": "object",
    "required": ["schedule", "slo", "period"],
    "properties": {
        "schedule": {"type": "string"},
        "slo": {"type": ["object", "null"]},
        "period": _ANY,
    },
}
REPLAYED = {
    "type": "object",
    "required": ["replayed", "id", "key", "audit_id", "links"],
    "properties": {
        "replayed": {"type": "string", "enum": ["job", "delivery"]},
        "id": {"type": "integer"},
        "key": _NULLABLE_STR,
        "audit_id": {"type": "integer"},
        "links": _LINKS,
    },
}
FIRED = {
    "type": "object",
    "required": ["schedule", "period", "fire_at", "now", "claimed", "late", "resumed", "links"],
    "properties": {
        "schedule": {"type": "string"},
        "period": {"type": "string"},
        "fire_at": {"type": "string"},
        "now": {"type": "string"},
        "claimed": {"type": "boolean"},
        "late": {"type": "boolean"},
        "resumed": {"type": "array", "items": {"type": "string"}},
        "links": _LINKS,
    },
}
CAPABILITIES = {
    "type": "object",
    "required": ["capabilities"],
    "properties": {"capabilities": {"type": "array", "items": _ANY}},
}
REPLAY_BODY = {
    "type": "object",
    "required": ["reason"],
    "properties": {"reason": {"type": "string", "minLength": 1, "pattern": "\\S"}},
    "additionalProperties": False,
}
#: operation -> (success statuses and their schema, request body schema)
SHAPES: dict[str, tuple[dict[str, dict[str, Any]], dict[str, Any] | None]] = {
    "get-job": ({"200": JOB}, None),
    "get-key": ({"200": RECEIPTS}, None),
    "list-periods": ({"200": PERIODS}, None),
    "get-schedule-periods": ({"200": SCHEDULE}, None),
    "get-period": ({"200": PERIOD}, None),
    "replay-dead-letter": ({"200": REPLAYED}, REPLAY_BODY),
    "fire-schedule": ({"200": FIRED, "202": FIRED}, None),
    "list-capabilities": ({"200": CAPABILITIES}, None),
    "get-capability": ({"200": _ANY}, None),
    "openapi": ({"200": _ANY}, None),
}
_PARAMETERS = {
    "id": {"type": "string", "pattern": "^[0-9]{1,18}$"},
    "key": {"type": "string", "minLength": 1},
    "schedule": {"type": "string", "minLength": 1},
    "period": {"type": "string", "minLength": 1},
    "name": {"type": "string", "minLength": 1},
    "capability": {"type": "string", "minLength": 1},
}


def _options(task_args: dict[str, Any] | None, jobs: dict[str, Any] | None) -> dict[str, Any]:
    """The enqueue body's schema: the arguments (or a batch of them) and when to run."""
    properties: dict[str, Any] = {
        "run_at": {"type": ["string", "null"], "format": "date-time"},
        "delay": {"type": ["number", "null"], "minimum": 0, "maximum": MAX_DELAY.total_seconds()},
        "priority": {"type": ["integer", "null"], "minimum": -1000, "maximum": 1000},
    }
    required: list[str] = []
    if task_args is not None:
        properties["args"] = task_args
        if task_args.get("required"):
            required.append("args")
    if jobs is not None:
        properties["jobs"] = jobs
        required.append("jobs")
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "not": {
            "required": ["run_at", "delay"],
            "properties": {"run_at": {"type": "string"}, "delay": {"type": "number"}},
        },
    }


def _arguments(task: Task) -> dict[str, Any]:
    schema = task_schema(task)
    schema.pop("$schema", None)
    return schema


def _operation(
    endpoint: Endpoint,
    operation: str,
    path: str,
    *,
    responses: dict[str, dict[str, Any]],
    body: dict[str, Any] | None,
    example: dict[str, Any] | None = None,
) -> dict[str, Any]:
    described: dict[str, Any] = {
        "operationId": operation,
        "summary": endpoint.summary,
        "x-oncebox-scope": endpoint.scope,
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": _PARAMETERS[name]}
            for name in _path_names(path)
        ],
        "responses": {
            **{
                status: {
                    "description": "success",
                    "content": {"application/json": {"schema": schema}},
                }
                for status, schema in responses.items()
            },
            "default": {
                "description": "a problem (RFC 9457)",
                "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
            },
        },
    }
    if endpoint.method == "POST":
        described["parameters"].append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                "description": "the same key and body answer the first response again",
            }
        )
    if "periods" in endpoint.query:
        described["parameters"].append(
            {
                "name": "periods",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "pattern": "^[0-9]+$"},
                "description": "how many of the latest periods (1-100; 12)",
            }
        )
    if body is not None:
        media: dict[str, Any] = {"schema": body}
        if example is not None:
            media["example"] = example
        described["requestBody"] = {"required": True, "content": {"application/json": media}}
    return described


def _path_names(path: str) -> list[str]:
    names = []
    for part in path.split("{")[1:]:
        names.append(part.split("}")[0].split(":")[0])
    return names


def _plain(path: str) -> str:
    """A router path as OpenAPI writes it (`{key:path}` is `{key}`)."""
    return path.replace(":path}", "}")


def openapi(box: Box, endpoints: Sequence[Endpoint], title: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        if endpoint.operation in {"enqueue", "enqueue-batch"}:
            for task in box.registry.all():
                path = endpoint.path.replace("{task}", quote(task.name, safe=""))
                arguments = _arguments(task)
                example_args = arguments["examples"][0]
                if endpoint.operation == "enqueue":
                    body = _options(arguments, None)
                    example = {"args": example_args}
                    responses = {"200": ENQUEUED, "201": ENQUEUED}
                else:
                    items = {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_BATCH,
                        "items": arguments,
                    }
                    body = _options(None, items)
                    example = {"jobs": [example_args]}
                    responses = {"200": BATCH, "201": BATCH}
                operation = f"{endpoint.operation}:{task.name}"
                paths.setdefault(path, {})[endpoint.method.lower()] = _operation(
                    endpoint, operation, path, responses=responses, body=body, example=example
                )
            continue
        answers, request = SHAPES[endpoint.operation]
        path = _plain(endpoint.path)
        paths.setdefault(path, {})[endpoint.method.lower()] = _operation(
            endpoint, endpoint.operation, path, responses=answers, body=request
        )
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {"title": title, "version": __version__},
        "paths": paths,
        "components": {
            "schemas": {"Problem": PROBLEM},
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "obx_<id>_<secret> (oncebox api-keys create)",
                }
            },
        },
        "security": [{"apiKey": []}],
    }


def capabilities(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every operation of the document, as the discovery index lists them."""
    found = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            found.append(
                {
                    "capability": operation["operationId"],
                    "method": method.upper(),
                    "path": path,
                    "scope": operation["x-oncebox-scope"],
                    "summary": operation["summary"],
                    "href": "/v1/discovery/" + quote(operation["operationId"], safe=":"),
                }
            )
    return found


def capability(
    document: dict[str, Any], wanted: str, base_url: str, samples: dict[str, str]
) -> dict[str, Any] | None:
    """One operation: its request and response schemas and runnable examples."""
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            if operation["operationId"] != wanted:
                continue
            media = operation.get("requestBody", {}).get("content", {}).get("application/json")
            body = None if media is None else copy.deepcopy(media.get("example", {}))
            if media is not None and not body and wanted == "replay-dead-letter":
                body = {"reason": "the provider's outage is over"}
            example_path = _example_path(path, samples)
            return {
                "capability": wanted,
                "summary": operation["summary"],
                "method": method.upper(),
                "path": path,
                "scope": operation["x-oncebox-scope"],
                "parameters": operation["parameters"],
                "request": None if media is None else media["schema"],
                "responses": {
                    status: next(iter(answer["content"].values()))["schema"]
                    for status, answer in operation["responses"].items()
                },
                "problem": PROBLEM,
                "examples": {
                    "path": example_path,
                    "body": body,
                    "curl": _curl(method.upper(), example_path, body, base_url),
                    "python": _python(method.upper(), example_path, body),
                },
            }
    return None


def samples(box: Box) -> dict[str, str]:
    """Path values for the examples, from what the box declares: a key its first keyed task
    renders from its example, its first schedule and that schedule's current period."""
    found = {"id": "1", "key": "a-key", "schedule": "a-schedule", "name": "a-schedule"}
    for task in box.registry.all():
        key = task.render_key(_arguments(task)["examples"][0]) if task.key else None
        if key:
            found["key"] = key
            break
    for name, schedule in sorted(box.schedules.items()):
        found["schedule"] = found["name"] = name
        found["period"] = schedule.period_of(box.store.clock_now())
        break
    return found


def _example_path(path: str, samples: dict[str, str]) -> str:
    filled = path
    for name in _path_names(path):
        value = samples.get(name, "")
        filled = filled.replace("{" + name + "}", quote(value, safe="/~"))
    return filled


def _curl(method: str, path: str, body: Any, base_url: str) -> str:
    lines = [f'curl -sS -X {method} "${{ONCEBOX_API:-{base_url}}}{path}"']
    lines.append('  -H "Authorization: Bearer $ONCEBOX_API_KEY"')
    if body is not None:
        lines.append('  -H "Content-Type: application/json"')
        lines.append("  -d '" + json.dumps(body).replace("'", "'\\''") + "'")
    return " \\\n".join(lines)


def _python(method: str, path: str, body: Any) -> str:
    data = "None" if body is None else f"json.dumps({body!r}).encode()"
    headers = ['"Authorization": "Bearer " + os.environ["ONCEBOX_API_KEY"]']
    if body is not None:
        headers += ['"Content-Type": "application/json"', '"Idempotency-Key": str(uuid.uuid4())']
    return "\n".join(
        [
            "import json, os, urllib.request, uuid",
            "",
            "request = urllib.request.Request(",
            f'    os.environ["ONCEBOX_API"] + {path!r},',
            f"    method={method!r},",
            f"    data={data},",
            "    headers={" + ", ".join(headers) + "},",
            ")",
            "with urllib.request.urlopen(request) as answer:",
            "    print(answer.status, json.load(answer))",
        ]
    )
