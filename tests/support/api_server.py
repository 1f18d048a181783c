"""The HTTP API served for real — uvicorn on a free port, in a thread — for tests whose callers
are plain HTTP clients running at once (the Starlette test client runs one request at a time)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import uvicorn

from oncebox import Box
from oncebox.api import ApiSettings, create_api
from support.console_browser import free_port
from support.waiting import wait_until


@contextmanager
def served_api(box: Box) -> Iterator[str]:
    """The API over `box` until the block ends (its shutdown waits for deferred fan-outs)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with served(create_api(box, ApiSettings(base_url=base)), port) as url:
        yield url


@contextmanager
def served(app: Any, port: int | None = None) -> Iterator[str]:
    """Any ASGI app served by uvicorn on loopback until the block ends; its base URL."""
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="the API to listen", timeout=30)
        yield base
    finally:
        server.should_exit = True
        thread.join(60)


def call(
    method: str, url: str, token: str, body: Any = None, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """One request as any language's plain HTTP client makes it: status, headers (lowercase
    names), JSON body."""
    data = None if body is None else json.dumps(body).encode()
    sent = {"Authorization": f"Bearer {token}", **(headers or {})}
    if data is not None:
        sent["Content-Type"] = "application/json"
    assert url.startswith("http://127.0.0.1:"), url  # the test's own server only
    request = urllib.request.Request(url, data=data, method=method, headers=sent)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
            return answer.status, _lower(answer.headers.items()), json.load(answer)
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, _lower(refused.headers.items()), json.load(refused)


def _lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers}
