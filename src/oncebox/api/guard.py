"""Every route's way in, in order: the caller's address, unless slowed for failed keys (429,
`auth_failures.py`), the API key (401), its scope (403), its budget (429), the
body — capped, JSON, parsed (413, 415, 400) — then, for a POST with an `Idempotency-Key`, the
key's record (a replay, 409 or 422), and only then the route, in a worker thread (the store is
synchronous). Nothing is written before every check has passed; an error is a problem detail.

Routes are plain functions of a `Call` returning an `Answer` (or raising `Problem` or an oncebox
error), declared as `Endpoint`s so the OpenAPI document and the discovery pages are generated
from the same list the router serves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from oncebox.api import idempotency
from oncebox.api.auth_failures import AuthFailures
from oncebox.api.budgets import Budgets
from oncebox.api.keys import ApiKey, Scope, authenticate
from oncebox.api.problems import MEDIA_TYPE, Problem, problem_of
from oncebox.api.settings import ApiSettings
from oncebox.box import Box
from oncebox.kernel.client_address import address_key
from oncebox.kernel.errors import OnceboxError

log = logging.getLogger("oncebox.api")
JSON_MEDIA = "application/json"
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
BODY_OVERHEAD = 64 * 1024  # beyond the job limit: the envelope, escapes, a batch's framing


@dataclass(frozen=True)
class Call:
    """What a route is given: the box, the caller's key, the path's and query's parameters,
    the parsed JSON body (None without one), and the path prefix links are built under."""

    box: Box
    key: ApiKey
    params: Mapping[str, str]
    query: Mapping[str, str]
    body: Any
    base: str
    defer: Callable[[Callable[[], object]], None]
    settings: ApiSettings

    def link(self, path: str) -> str:
        return self.base + path


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Endpoint:
    """One route: its OpenAPI operation (`operation`, `summary`, `method`, `path`), who may
    call it (`scope`; None: any key), whether it takes a body (every POST honours an
    Idempotency-Key) and the query parameters it reads (any other is refused: a typo is said,
    not ignored)."""

    operation: str
    method: str
    path: str
    scope: Scope | None
    summary: str
    handler: Callable[[Call], Answer]
    takes_body: bool = False
    query: tuple[str, ...] = ()  # the query parameters it reads; any other is refused


def json_response(status: int, body: str | dict[str, Any], headers: Mapping[str, str]) -> Response:
    """A JSON answer; every error body is a problem detail, and says so in its media type."""
    text = body if isinstance(body, str) else encode(body)
    media = MEDIA_TYPE if status >= 400 else JSON_MEDIA
    return Response(text, status, headers={**HEADERS, **headers}, media_type=media)


def encode(body: dict[str, Any]) -> str:
    """ASCII JSON: every control character — C0, DEL, C1 — and bidirectional override a caller
    or provider wrote arrives escaped, inert wherever the answer is shown."""
    return json.dumps(body, ensure_ascii=True, separators=(",", ":"))


async def _body(request: Request, cap: int) -> bytes:
    """The body, refused past `cap` bytes without reading the rest."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise Problem(413, "body-too-large", f"the body is {declared} bytes; the cap is {cap}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise Problem(413, "body-too-large", f"the body is over the cap of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parsed(raw: bytes, content_type: str | None) -> Any:
    media = (content_type or "").split(";")[0].strip().lower()
    if media != JSON_MEDIA and not (media.startswith("application/") and media.endswith("+json")):
        raise Problem(415, "unsupported-media-type", "send the body as application/json")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise Problem(400, "malformed-request", f"the body is not JSON: {reason}") from None


def serve(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette handler of `endpoint` (see the module docstring)."""

    async def handle(request: Request) -> Response:
        instance = request.url.path
        try:
            return await _handle(endpoint, request)
        except Problem as problem:
            return _problem_response(problem, instance)
        except OnceboxError as exc:
            return _problem_response(problem_of(exc), instance)

    return handle


def _problem_response(problem: Problem, instance: str) -> Response:
    response = problem.response(instance)
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def admit(
    box: Box,
    budgets: Budgets,
    endpoint: Endpoint,
    authorization: str | None,
    caller: tuple[str, AuthFailures | None],
) -> ApiKey:
    """The caller's live key, if its address is not slowed for failed keys (`auth_failures`),
    it holds the endpoint's scope and has budget left. `caller` is the client's address and
    the app's failure counts (None: not counted)."""
    address, failures = caller
    attempt = None if failures is None else failures.begin(address, authorization)
    if attempt is not None and attempt.wait is not None:
        raise Problem(
            429,
            "auth-throttled",
            "too many requests from this address with a missing or wrong API key; retry in "
            f"{attempt.wait} s",
            headers={"Retry-After": str(attempt.wait)},
        )
    try:
        key = authenticate(box.store, authorization)
    except BaseException:  # the store failed, not the key: its provisional failure goes back
        if failures is not None and attempt is not None:
            failures.give_back(attempt)
        raise
    if failures is not None and attempt is not None:
        failures.end(attempt, key)
    if key is None:
        raise Problem(
            401,
            "unauthorized",
            "send `Authorization: Bearer obx_…` with a live API key (oncebox api-keys create)",
            headers={"WWW-Authenticate": 'Bearer realm="oncebox"'},
        )
    if endpoint.scope is not None and not key.may(endpoint.scope):
        raise Problem(403, "forbidden", f"API key {key.name!r} lacks the scope {endpoint.scope!r}")
    wait = budgets.spend(key)
    if wait is not None:
        raise Problem(
            429,
            "rate-limited",
            f"API key {key.name!r} may make {key.rate.name} requests; retry in {wait} s",
            headers={"Retry-After": str(wait)},
        )
    return key


def _check_query(endpoint: Endpoint, names: Iterable[str]) -> None:
    unknown = sorted(set(names) - set(endpoint.query))
    if unknown:
        raise Problem(
            400,
            "malformed-request",
            f"unknown query parameter(s) {', '.join(map(repr, unknown[:5]))}; "
            f"this route reads {', '.join(endpoint.query) or 'none'}",
        )


async def _handle(endpoint: Endpoint, request: Request) -> Response:
    box: Box = request.app.state.box
    authorization = request.headers.get("authorization")
    host = request.client.host if request.client else None
    caller = (address_key(host), request.app.state.auth_failures)  # an IPv6 client per /64
    key = await run_in_threadpool(
        admit, box, request.app.state.budgets, endpoint, authorization, caller
    )
    _check_query(endpoint, request.query_params)
    raw = b""
    body: Any = None
    if endpoint.takes_body:
        raw = await _body(request, request.app.state.body_cap)
        body = _parsed(raw, request.headers.get("content-type"))
    idem = idempotency.header_value(request.headers.get(idempotency.HEADER))
    call = Call(
        box,
        key,
        dict(request.path_params),
        dict(request.query_params),
        body,
        request.scope.get("root_path", ""),
        request.app.state.defer,
        request.app.state.settings,
    )
    request_print = idempotency.fingerprint(request.method, request.url.path, raw)

    def run() -> Response:
        held: idempotency.Held | None = None
        if idem is not None and endpoint.method == "POST":
            begun = idempotency.begin(box.store, key.id, idem, request_print)
            if isinstance(begun, idempotency.Replay):
                replayed = {**begun.headers, "Idempotent-Replayed": "true"}
                return json_response(begun.status, begun.body, replayed)
            held = begun
        try:
            with idempotency.kept(box.store, held):  # a retry meanwhile is told 409
                status, text, headers = _answer(endpoint, call, request.url.path)
        except BaseException:  # a bug: nothing decided, so the key is let go for a retry
            if held is not None:
                idempotency.finish(box.store, held, 500, "", {})
            raise
        if held is not None:
            idempotency.finish(box.store, held, status, text, headers)
        return json_response(status, text, headers)

    return await run_in_threadpool(run)


def _answer(endpoint: Endpoint, call: Call, instance: str) -> tuple[int, str, dict[str, str]]:
    """The route's answer as status, JSON text and headers — a problem included, so that a
    refused request's answer is kept for its retries as a success's is."""
    try:
        answer = endpoint.handler(call)
        return answer.status, encode(answer.body), answer.headers
    except Problem as problem:
        return problem.status, encode(problem.body(instance)), problem.headers
    except OnceboxError as exc:
        known = problem_of(exc)
        return known.status, encode(known.body(instance)), known.headers
