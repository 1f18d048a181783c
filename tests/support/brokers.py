"""The brokers the transport tests talk to: the machine's own servers, never a mock. Outside CI a
test skips loudly when its broker cannot be reached; in CI it fails (`.ci/run` starts them)."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlencode, urlsplit

import pytest

AMQP_URL = os.environ.get("ONCEBOX_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
NATS_URL = os.environ.get("ONCEBOX_TEST_NATS", "nats://127.0.0.1:4222")


def reachable(url: str) -> str:
    """`url` when its server accepts a connection; else skip (fail in CI) saying which."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5672
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        message = f"no broker at {host}:{port} ({exc}); `.ci/run` starts the machine's own"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (required in CI)")
        pytest.skip(f"!!! SKIPPING: {message} !!!")
    return url


def sqs_url(endpoint: str, *, fifo: bool = False, visibility: int = 30) -> str:
    """An oncebox SQS broker URL on the tests' server."""
    query = urlencode(
        {"endpoint": endpoint, "fifo": str(fifo).lower(), "visibility": visibility, "wait": 1}
    )
    return f"sqs://us-east-1?{query}"
