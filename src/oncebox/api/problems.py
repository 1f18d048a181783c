"""Errors as RFC 9457 problem details: `application/problem+json` with a `type` per kind of
problem (a URN: stable, documented in docs/api.md, never fetched), a `title` per type, and a
`detail` for this occurrence.

What callers and providers wrote (a task name, a key, an error) may appear in `detail`; JSON
escapes every control character, and the detail is cut to a bounded length, so it stays inert.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from oncebox.kernel.errors import (
    BrokerUnavailable,
    ConfigurationError,
    EnqueueError,
    InvalidState,
    KeyDrift,
    NotFound,
    OnceboxError,
    PayloadTooLarge,
    StoreUnavailable,
    UnknownTask,
)

TYPE_PREFIX = "urn:oncebox:problem:"
MEDIA_TYPE = "application/problem+json"
DETAIL_LIMIT = 2000
RETRY_UNAVAILABLE_S = 5  # what a 503 asks the caller to wait

TITLES: dict[str, str] = {
    "unauthorized": "An API key is required",
    "signature-refused": "The delivery webhook's signature does not verify",
    "forbidden": "The API key lacks the scope this route needs",
    "rate-limited": "The API key's request budget is spent",
    "auth-throttled": "Too many requests from this address with a missing or wrong API key",
    "not-found": "No such resource",
    "unknown-task": "No task of that name is registered",
    "method-not-allowed": "The route does not take that method",
    "malformed-request": "The request cannot be read",
    "unsupported-media-type": "The body must be JSON",
    "body-too-large": "The request body is larger than the server accepts",
    "invalid-arguments": "The job's arguments are refused",
    "payload-too-large": "The job's arguments are larger than the job limit",
    "invalid-state": "The resource's state does not allow that",
    "key-drift": "The code's keys differ from what the store recorded",
    "idempotency-key-reused": "The Idempotency-Key was used with another request",
    "idempotency-key-in-flight": "A request with that Idempotency-Key is still being answered",
    "unavailable": "A service the server needs cannot be reached",
    "internal": "The server failed",
}


class Problem(Exception):
    """A problem to answer with; raised anywhere in a route, answered by the guard."""

    def __init__(
        self,
        status: int,
        kind: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        if kind not in TITLES:
            raise ValueError(f"undocumented problem type {kind!r}")
        self.status = status
        self.kind = kind
        self.detail = detail if len(detail) <= DETAIL_LIMIT else detail[:DETAIL_LIMIT] + "…"
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def body(self, instance: str) -> dict[str, Any]:
        return {
            "type": TYPE_PREFIX + self.kind,
            "title": TITLES[self.kind],
            "status": self.status,
            "detail": self.detail,
            "instance": instance,
            **self.extra,
        }

    def response(self, instance: str) -> JSONResponse:
        return JSONResponse(
            self.body(instance), self.status, headers=self.headers, media_type=MEDIA_TYPE
        )


def problem_of(exc: OnceboxError) -> Problem:
    """The problem an oncebox error is, for a caller: their mistakes are 4xx, the store or a
    broker away is 503 with a Retry-After (nothing was written), anything else 500."""
    text = str(exc)
    if isinstance(exc, UnknownTask):  # its text may list every task: not for any caller
        return Problem(404, "unknown-task", "the task is not registered here")
    if isinstance(exc, PayloadTooLarge):
        return Problem(413, "payload-too-large", text)
    if isinstance(exc, (EnqueueError, ConfigurationError)):
        return Problem(422, "invalid-arguments", text)
    if isinstance(exc, NotFound):
        return Problem(404, "not-found", text)
    if isinstance(exc, InvalidState):
        return Problem(409, "invalid-state", text)
    if isinstance(exc, KeyDrift):
        return Problem(409, "key-drift", text)
    if isinstance(exc, (StoreUnavailable, BrokerUnavailable)):
        retry = {"Retry-After": str(RETRY_UNAVAILABLE_S)}
        return Problem(503, "unavailable", text, headers=retry)
    return Problem(500, "internal", f"{type(exc).__name__}: {text}")
