"""The brokers the transport tests talk to: the machine's own servers, never a mock. Outside CI a
test skips loudly when its broker cannot be reached, or the program of a private one to restart
is missing; in CI it fails (`.ci/run` starts them)."""

from __future__ import annotations

import os
import socket
from typing import NoReturn
from urllib.parse import urlencode, urlsplit

import pytest

from oncebox.chaos import private_nats
from oncebox.kernel.errors import ConfigurationError

AMQP_URL = os.environ.get("ONCEBOX_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")
NATS_URL = os.environ.get("ONCEBOX_TEST_NATS", "nats://127.0.0.1:4222")


def missing(message: str) -> NoReturn:
    """Skip loudly, saying what is missing; in CI, where `.ci/run` provides it, fail."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (required in CI)")
    pytest.skip(f"!!! SKIPPING: {message} !!!")


def reachable(url: str) -> str:
    """`url` when its server accepts a connection; else skip (fail in CI) saying which."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5672
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        missing(f"no broker at {host}:{port} ({exc}); `.ci/run` starts the machine's own")
    return url


def nats_server_installed() -> None:
    """The restart tests start a private nats-server (the shared one is never restarted): skip
    (fail in CI) when the machine has none."""
    try:
        private_nats.program()
    except ConfigurationError as exc:
        missing(str(exc))


def sqs_url(endpoint: str, *, fifo: bool = False, visibility: int = 30) -> str:
    """An oncebox SQS broker URL on the tests' server."""
    query = urlencode(
        {"endpoint": endpoint, "fifo": str(fifo).lower(), "visibility": visibility, "wait": 1}
    )
    return f"sqs://us-east-1?{query}"
