"""Enqueue over HTTP, and a job read back: the same enqueue as Python's — the registry checks
the arguments, the task's template renders the business key from them, and a key already
claimed is answered, not written twice (`created: false` and why, with status 200)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from oncebox import shapes
from oncebox.api.guard import Answer, Call
from oncebox.api.problems import Problem
from oncebox.jobs.tasks import Task
from oncebox.runtime.enqueue import EnqueueResult

MAX_DELAY = timedelta(days=366)
DIGITS = re.compile(r"[0-9]{1,18}")  # an id: ASCII digits (str.isdigit() admits '²')
# RFC 3339's date-time: datetime.fromisoformat alone also takes ISO 8601's other forms
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})")
MAX_BATCH = 1000
_OPTIONS = ("run_at", "delay", "priority")


def key_path(key: str) -> str:
    return "/v1/keys/" + quote(key, safe="/~")


def _invalid(detail: str) -> Problem:
    return Problem(422, "invalid-arguments", detail)


def _object(body: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _invalid("the body must be a JSON object")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise _invalid(f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: {allowed}")
    return body


def _when(body: dict[str, Any]) -> dict[str, Any]:
    """`run_at` (RFC 3339 with an offset), `delay` (seconds) and `priority`, as enqueue takes
    them; at most one of `run_at` and `delay`."""
    options: dict[str, Any] = {}
    if body.get("run_at") is not None and body.get("delay") is not None:
        raise _invalid("give run_at or delay, not both")
    run_at = body.get("run_at")
    if run_at is not None:
        try:
            valid = isinstance(run_at, str) and RFC3339.fullmatch(run_at)
            parsed = datetime.fromisoformat(run_at) if valid else None
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            raise _invalid(
                "run_at must be an RFC 3339 instant with an offset, e.g. 2026-12-07T06:00:00Z"
            )
        options["run_at"] = parsed
    delay = body.get("delay")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise _invalid("delay is a number of seconds")
        if not 0 <= delay <= MAX_DELAY.total_seconds():
            raise _invalid(f"delay must be between 0 and {MAX_DELAY.days} days in seconds")
        options["delay"] = timedelta(seconds=delay)
    priority = body.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > 1000:
            raise _invalid("priority is an integer from -1000 to 1000")
        options["priority"] = priority
    return options


def _enqueued(result: EnqueueResult, task: str) -> dict[str, Any]:
    links = {} if result.job_id is None else {"job": f"/v1/jobs/{result.job_id}"}
    if result.key is not None:
        links["key"] = key_path(result.key)
    return {
        "task": task,
        "created": result.created,
        "job_id": result.job_id,
        "key": result.key,
        "state": result.state,
        "reason": result.reason,
        "summary": str(result),
        "links": links,
    }


def _task(call: Call) -> Task:
    """The path's task; 404 naming only the name asked for — the registry's own error lists
    every task, which is for the CLI's operator, not for any key holder (the discovery
    routes describe the tasks a key may enqueue)."""
    name = call.params["task"]
    if name not in call.box.registry:
        raise Problem(404, "unknown-task", f"no task named {name[:100]!r} is registered")
    return call.box.registry.get(name)


def enqueue(call: Call) -> Answer:
    task = _task(call)
    body = _object(call.body, ("args", *_OPTIONS))
    args = body.get("args", {})
    if not isinstance(args, dict):
        raise _invalid("args must be a JSON object of the task's arguments")
    result = call.box.enqueue_args(task, args, **_when(body))
    shape = _enqueued(result, task.name)
    if not result.created:
        return Answer(200, shape)
    return Answer(201, shape, {"Location": call.link(shape["links"]["job"])})


def enqueue_batch(call: Call) -> Answer:
    task = _task(call)
    body = _object(call.body, ("jobs", *_OPTIONS))
    jobs = body.get("jobs")
    if not isinstance(jobs, list) or not jobs or len(jobs) > MAX_BATCH:
        raise _invalid(f"jobs must be a list of 1 to {MAX_BATCH} argument objects")
    if not all(isinstance(args, dict) for args in jobs):
        raise _invalid("each item of jobs is a JSON object of the task's arguments")
    result = call.box.enqueue_many(task, jobs, **_when(body))
    shape = {
        "task": task.name,
        "created": result.created,
        "skipped": result.skipped,
        "job_ids": result.job_ids,
    }
    return Answer(201 if result.created else 200, shape)


def job(call: Call) -> Answer:
    text = call.params["id"]
    row = call.box.store.job_get(int(text)) if DIGITS.fullmatch(text) else None
    if row is None:
        raise Problem(404, "not-found", f"no job {text[:40]!r}")
    shape = shapes.job(row, call.box.store.job_attempt_list(row.id))
    return Answer(200, {"job": shape, "links": {"key": key_path(row.key)} if row.key else {}})
