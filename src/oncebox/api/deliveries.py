"""The receiver of providers' delivery webhooks (`deliveries/` reads and records them): an ASGI
app, `POST /{channel}` per channel whose `reports=` names its signing secret — mounted by
`oncebox serve` under `/deliveries`, or served alone by `oncebox receive`.

Each request is answered so that the provider does the right thing next: a signature or a
timestamp that does not verify is refused (`401`, nothing read further, nothing written); a
verified event is recorded and acknowledged (`200`, `deliveries/receiving.py`, which the
simulation's reporter calls too), settling the held send it says the provider
took in the same transaction — also when it is about a message oncebox does not hold, of a kind
it does not track, or not an event at all (counted, and acknowledged so it is not sent again);
the store away is `503` with `Retry-After`, so the provider retries it later. The body is read
up to 256 KiB and no further (`413`). Refusals are the API's problem details (`problems.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from oncebox.api.problems import Problem, problem_of
from oncebox.box import Box
from oncebox.deliveries.receiving import receive_event, receive_unreadable
from oncebox.deliveries.reports import Reports
from oncebox.kernel.errors import StoreUnavailable
from oncebox.kernel.inert import printable
from oncebox.providers.webhook_signatures import (
    MAX_WEBHOOK_BYTES,
    UnreadableBody,
    WebhookRefused,
    verify_webhook,
    webhook_headers,
)

log = logging.getLogger("oncebox.deliveries")


def reporting_channels(box: Box) -> dict[str, Reports]:
    """The box's channels whose providers report, and their settings."""
    return {
        name: channel.reports
        for name, channel in sorted(box.channels.items())
        if channel.reports is not None
    }


def create_receiver(box: Box) -> Starlette:
    """The receiver for every reporting channel of `box`; a `ConfigurationError` naming the
    first whose secret is not set (at start, not at the first event)."""
    channels = reporting_channels(box)
    secrets = {name: reports.secret(name) for name, reports in channels.items()}

    async def receive(request: Request) -> Response:
        name = request.path_params["channel"]
        if name not in channels:
            detail = f"no channel {printable(name)!r} takes provider reports here"
            return Problem(404, "not-found", detail).response(request.url.path)
        body = await _capped(request)
        if body is None:
            detail = f"a delivery event is at most {MAX_WEBHOOK_BYTES} bytes"
            return Problem(413, "body-too-large", detail).response(request.url.path)
        try:
            payload = verify_webhook(
                secrets[name], request.headers, body, tolerance=channels[name].tolerance
            )
        except UnreadableBody as unreadable:  # signed, so the provider's: not to be retried
            return await run_in_threadpool(_unreadable, box, name, unreadable.reason)
        except WebhookRefused as refused:
            log.warning("channel %s: a delivery webhook refused: %s", name, refused.reason)
            return Problem(401, "signature-refused", refused.reason).response(request.url.path)
        try:
            return await run_in_threadpool(_record, box, name, request.headers, payload)
        except StoreUnavailable as exc:
            return problem_of(exc).response(request.url.path)

    return Starlette(routes=[Route("/{channel}", receive, methods=["POST"])])


def _record(
    box: Box, channel: str, headers: Mapping[str, str], payload: Mapping[str, Any]
) -> Response:
    event_id, _stamp, _signature = webhook_headers(headers)
    return JSONResponse(receive_event(box.store, channel, event_id, payload).body())


def _unreadable(box: Box, channel: str, reason: str) -> Response:
    return JSONResponse(receive_unreadable(box.store, channel, reason).body())


async def _capped(request: Request) -> bytes | None:
    """The body, or None once it passes the cap (the rest is not read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_WEBHOOK_BYTES:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_WEBHOOK_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
