"""The worker's log in two shapes: lines for people, JSON lines for a log pipeline.

A log pipeline (Loki, CloudWatch, Elastic) searches by field, so a job's lines carry the job's
identity as fields — its key, job id, attempt and the worker that ran it — and, when an
OpenTelemetry span is current, its trace id, so a line leads to the trace. `job_fields` is what
the lanes pass as `extra=`; `JsonLines` writes one JSON object per record, every value escaped
by JSON itself (a handler's error or a provider's reply cannot break a line or drive a
terminal).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

FIELDS = "oncebox"  # the record attribute `job_fields` sets


def job_fields(key: str | None, job_id: int | None, attempt: int, worker: str) -> dict[str, Any]:
    """`extra=` for a log call about one job's attempt."""
    return {FIELDS: {"key": key, "job_id": job_id, "attempt": attempt, "worker": worker}}


class JsonLines(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the job's
    fields when the record is about a job, the trace id when a span is current, and the
    exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, FIELDS, None) or {})
        trace_id = current_trace_id()
        if trace_id is not None:
            line["trace_id"] = trace_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=True, default=str)


def current_trace_id() -> str | None:
    """The current OpenTelemetry span's trace id (32 hex digits), if the API is installed and a
    span is recording; None otherwise."""
    try:
        from opentelemetry import trace  # noqa: PLC0415 (optional)
    except ImportError:
        return None
    context = trace.get_current_span().get_span_context()
    return f"{context.trace_id:032x}" if context.is_valid else None
