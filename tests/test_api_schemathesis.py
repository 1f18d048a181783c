"""Schemathesis against the OpenAPI document the API serves: for requests generated from the
document — valid ones, and ones the document says are invalid — the server never fails (5xx),
answers only statuses, media types, headers and bodies the document declares, and refuses what
the document does not admit. The document is the one a client reads: generated from the task
registry, served at /openapi.json (the suite's run draws a few dozen requests per operation and
mode, the same ones every run)."""

from __future__ import annotations

import atexit
import shutil
from functools import cache
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.testclient import TestClient

from oncebox.api import create_api
from oncebox.api.app import endpoints
from oncebox.api.keys import issue_key
from oncebox.examples.logistics.app import build_box, create_tables

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@cache
def served() -> tuple[Any, dict[str, str]]:
    """The served document as schemathesis loads it, calling the app in process, and the
    headers of a key with every scope (its budget out of the way)."""
    folder = Path(mkdtemp(prefix="oncebox-schemathesis-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    box = build_box(f"sqlite:///{folder / 'api.db'}", email=f"file://{folder / 'sent'}")
    create_tables(box)
    token = issue_key(
        box.store, "fuzz", ["enqueue", "read", "operate"], rate="100000/s", by="test"
    ).token
    app = create_api(box)
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        document = client.get("/openapi.json", headers=headers).json()
    schema = schemathesis.openapi.from_dict(document)
    schema.app = app
    return schema, headers


def operations() -> list[str]:
    """The document's operations: one enqueue and one batch per task, the rest once."""
    names = [e.operation for e in endpoints() if not e.operation.startswith("enqueue")]
    return ["enqueue:weekly_digest", "enqueue-batch:weekly_digest", *names]


@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
@pytest.mark.parametrize("operation_id", operations())
def test_the_api_keeps_to_its_own_openapi_document(operation_id: str, mode: GenerationMode):
    schema, headers = served()
    operation = schema.find_operation_by_id(operation_id)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    def keeps_to_it(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    keeps_to_it()
