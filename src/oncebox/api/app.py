"""The API's ASGI app: its endpoints, the router, and what runs beside the requests (a
schedule's fan-out after its trigger was answered; the expired Idempotency-Key records' prune)."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from oncebox.api import describe, jobs, operate, reads
from oncebox.api.auth_failures import AuthFailures
from oncebox.api.budgets import Budgets
from oncebox.api.guard import BODY_OVERHEAD, HEADERS, Answer, Call, Endpoint, serve
from oncebox.api.problems import Problem
from oncebox.api.settings import ApiSettings
from oncebox.box import Box
from oncebox.limits.rates import Limit

log = logging.getLogger("oncebox.api")
PRUNE_EVERY = timedelta(minutes=5)
PRUNE_BATCH = 1000
COUNT_EVERY = timedelta(seconds=10)


def endpoints() -> list[Endpoint]:
    """Every route of the API, in the order the OpenAPI document lists them."""
    return [
        Endpoint(
            "enqueue",
            "POST",
            "/v1/tasks/{task}/jobs",
            "enqueue",
            "Enqueue one job of the task",
            jobs.enqueue,
            takes_body=True,
        ),
        Endpoint(
            "enqueue-batch",
            "POST",
            "/v1/tasks/{task}/jobs:batch",
            "enqueue",
            "Enqueue jobs of the task as one set, in one transaction",
            jobs.enqueue_batch,
            takes_body=True,
        ),
        Endpoint("get-job", "GET", "/v1/jobs/{id}", "read", "A job and its attempts", jobs.job),
        Endpoint(
            "get-key",
            "GET",
            "/v1/keys/{key:path}",
            "read",
            "A key's receipt chain: its intent, jobs, messages and audit",
            reads.receipts,
        ),
        Endpoint(
            "list-periods",
            "GET",
            "/v1/periods",
            "read",
            "Every schedule's latest periods: coverage and SLO",
            reads.periods,
            query=("periods",),
        ),
        Endpoint(
            "get-schedule-periods",
            "GET",
            "/v1/periods/{schedule}",
            "read",
            "One schedule's latest periods",
            reads.schedule_periods,
            query=("periods",),
        ),
        Endpoint(
            "get-period",
            "GET",
            "/v1/periods/{schedule}/{period}",
            "read",
            "One period of a schedule",
            reads.period,
        ),
        Endpoint(
            "replay-dead-letter",
            "POST",
            "/v1/dead-letters/{key:path}/replay",
            "operate",
            "Replay a dead job or message, audited with the reason",
            operate.replay,
            takes_body=True,
        ),
        Endpoint(
            "fire-schedule",
            "POST",
            "/v1/schedules/{name}/fire",
            "operate",
            "Fire a schedule as an external cron: its due period, fanned out once",
            operate.fire,
        ),
        Endpoint(
            "list-capabilities",
            "GET",
            "/v1/discovery",
            None,
            "What this API can do",
            _list_capabilities,
        ),
        Endpoint(
            "get-capability",
            "GET",
            "/v1/discovery/{capability}",
            None,
            "One capability: request and response schemas, runnable examples",
            _get_capability,
        ),
        Endpoint("openapi", "GET", "/openapi.json", None, "This API as OpenAPI 3.1", _document),
    ]


def _the_document(call: Call) -> dict[str, Any]:
    return describe.openapi(call.box, endpoints(), call.settings.title)


def _document(call: Call) -> Answer:
    return Answer(200, _the_document(call))


def _list_capabilities(call: Call) -> Answer:
    return Answer(200, {"capabilities": describe.capabilities(_the_document(call))})


def _get_capability(call: Call) -> Answer:
    wanted = call.params["capability"]
    base = call.settings.base_url
    found = describe.capability(_the_document(call), wanted, base, describe.samples(call.box))
    if found is None:
        raise Problem(404, "not-found", f"no capability {wanted[:100]!r} (GET /v1/discovery)")
    return Answer(200, found)


async def _http_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        problem = Problem(405, "method-not-allowed", f"{request.method} is not served here")
    else:
        problem = Problem(404, "not-found", "no such route (GET /v1/discovery lists them)")
    response = problem.response(request.url.path)
    response.headers.update(HEADERS)
    return response


async def _internal(request: Request, exc: Exception) -> Response:
    log.exception("API %s %s failed", request.method, request.url.path, exc_info=exc)
    problem = Problem(500, "internal", "the server failed (its log has the error); retry")
    response = problem.response(request.url.path)
    response.headers.update(HEADERS)
    return response


def create_api(box: Box, settings: ApiSettings | None = None) -> Starlette:
    """The API over `box` (its tasks and schedules declared). Mount it, or serve it alone."""
    settings = settings or ApiSettings()
    routes = [Route(e.path, serve(e), methods=[e.method], name=e.operation) for e in endpoints()]
    executor = ThreadPoolExecutor(settings.fan_out_threads, thread_name_prefix="api-fan-out")

    def defer(work: Callable[[], object]) -> None:
        def run() -> None:
            try:
                work()
            except Exception:  # the run's lease runs out; the next trigger or a ticker resumes it
                log.exception(
                    "a fired schedule's fan-out failed; once its lease runs out, the next "
                    "trigger (or a ticker) resumes it"
                )

        try:
            executor.submit(run)
        except RuntimeError:  # shutting down: the claimed run is fanned out here, not dropped
            run()

    failures = (
        None
        if settings.auth_failures is None
        else AuthFailures(Limit.parse(settings.auth_failures))
    )

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        stop = threading.Event()
        threads = [threading.Thread(target=_prune, args=(box, stop), name="api-prune", daemon=True)]
        if failures is not None:
            threads.append(
                threading.Thread(
                    target=_count, args=(box, failures, stop), name="api-counts", daemon=True
                )
            )
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            # the fan-outs already answered for finish first, off the event loop
            await anyio.to_thread.run_sync(executor.shutdown)
            for thread in threads:
                await anyio.to_thread.run_sync(thread.join, 10)

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_problem, Exception: _internal},
    )
    app.state.box = box
    app.state.settings = settings
    app.state.budgets = Budgets(box.store)
    app.state.body_cap = box.max_payload_bytes + BODY_OVERHEAD
    app.state.defer = defer
    app.state.auth_failures = failures
    return app


def _count(box: Box, failures: AuthFailures, stop: threading.Event) -> None:
    """Write the refused and throttled requests' counts now and then, and once more at stop."""
    while True:
        stopping = stop.wait(COUNT_EVERY.total_seconds())
        try:
            failures.flush(box.store)
        except Exception:  # the store away: kept for the next round
            log.warning("writing the API's refused-key counts failed", exc_info=True)
        if stopping:
            return


def _prune(box: Box, stop: threading.Event) -> None:
    """Delete expired Idempotency-Key records now and then (what a retry can no longer use)."""
    while not stop.is_set():
        try:
            while box.store.api_request_prune(PRUNE_BATCH) == PRUNE_BATCH and not stop.is_set():
                pass
        except Exception:  # the store away: the next round tries again
            log.warning("pruning expired Idempotency-Key records failed", exc_info=True)
        stop.wait(PRUNE_EVERY.total_seconds())
