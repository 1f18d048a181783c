"""OpenTelemetry spans for a job's life — enqueue, process, send — joined into one trace.

A web request that enqueues a job, the worker that runs it minutes later and the dispatcher that
sends its email are three processes and three transactions; what joins them is the trace
context each row keeps (`trace_context`, its own column on jobs and outbox rows: never the
arguments, which feed keys and signature checks). The enqueue span's context is stored with the
job; the process span is its child; the context current while the handler writes an outbox row
is stored with the row, and the send span is a child of that. A retried job's attempts, and a
retried message's sends, are then siblings under the span that wrote them.

The spans follow OpenTelemetry's messaging semantic conventions: `{operation} {destination}`
names, PRODUCER for enqueue and send, CONSUMER for process, `messaging.*` attributes, and a
span status of ERROR when the attempt failed. oncebox depends on the API only (`oncebox[otel]`);
the SDK and its exporter are the application's. Without the API installed, or with no SDK
configured, every function here costs next to nothing and writes no context.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised by the suite without the extra
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span

SYSTEM = "oncebox"
# a stored context larger than this is not kept: W3C caps `tracestate` at 32 members, and a
# vendor's state of kilobytes would be put on every job
MAX_CONTEXT_CHARS = 2048


class Traced:
    """What the code being traced sees of its span: attributes set after the fact (a job id,
    an outcome) and a failure. A no-op when nothing records the span."""

    __slots__ = ("_span",)

    def __init__(self, span: Span | None) -> None:
        self._span = span if span is not None and span.is_recording() else None

    def set(self, **attributes: str | int | bool | None) -> None:
        """Set attributes named with `__` for `.` (`messaging__message__id=...`)."""
        if self._span is not None:
            for name, value in attributes.items():
                if value is not None:
                    self._span.set_attribute(name.replace("__", "."), value)

    def failed(self, error: BaseException | str) -> None:
        """Mark the span's outcome as an error (the attempt failed, the send did not happen),
        with the exception recorded as the conventions ask, when there is one."""
        if self._span is None:
            return
        if isinstance(error, BaseException):
            self._span.record_exception(error)
            error = f"{type(error).__name__}: {error}"
        self._span.set_status(StatusCode.ERROR, error[:500])


_NOTHING = Traced(None)
UNTRACED = _NOTHING  # what code sees of a span nothing records (see `recording`)
# a proxy until the application sets its tracer provider, then that provider's tracer
_tracer = None if trace is None else trace.get_tracer("oncebox")
_NO_SDK = () if trace is None else (ProxyTracerProvider, NoOpTracerProvider)
_W3C = None if trace is None else TraceContextTextMapPropagator()


def current_context() -> str | None:
    """The current trace context as a row stores it (JSON of W3C `traceparent` and
    `tracestate`; never baggage), or None when no valid span is current."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)  # the trace's place only: never baggage, which may hold personal data
    if not carrier:
        return None
    text = json.dumps(carrier, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= MAX_CONTEXT_CHARS else None


def _parent(stored: str | None) -> Context:
    """The context a stored row's span continues. Whatever the row holds — nothing, or text no
    propagator can read (an older release, a hand-edited row) — a bad value starts a new trace
    rather than failing a job."""
    empty = Context()
    if not stored:
        return empty
    try:
        carrier = json.loads(stored)
    except ValueError:
        return empty
    if not isinstance(carrier, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()
    ):
        return empty
    return _W3C.extract(carrier, context=empty)


def recording() -> bool:
    """Whether a span started now would be recorded: the API is installed and an SDK's tracer
    provider is set. Asking costs a look at the environment (the API's own lookup of its
    provider); the consumer asks once per transaction and, when nothing records, runs the
    batch's handlers without building a span's attributes and parent per job. A provider set
    meanwhile is seen from the next transaction (the API lets one be set once per process)."""
    return _tracer is not None and not isinstance(trace.get_tracer_provider(), _NO_SDK)


@contextmanager
def _span(
    name: str, kind: Any, attributes: Mapping[str, str | int], parent: Context | None = None
) -> Iterator[Traced]:
    if not recording():
        yield _NOTHING  # nothing would record it: not even a no-op span per job
        return
    with _tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=dict(attributes)
    ) as span:
        yield Traced(span)


def _messaging(operation: str, name: str, destination: str) -> dict[str, str | int]:
    """The messaging conventions' attributes every span here carries."""
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": name,
        "messaging.destination.name": destination,
    }


def enqueue_span(queue: str, task: str) -> AbstractContextManager[Traced]:
    """Around an enqueue of one job or of many of one task: the job rows store its context."""
    attributes = {**_messaging("send", "enqueue", queue), "oncebox.task": task}
    return _span(f"enqueue {queue}", _kind("PRODUCER"), attributes)


def process_span(
    stored: str | None, *, queue: str, task: str, job: str, key: str | None, attempt: int
) -> AbstractContextManager[Traced]:
    """Around one handler run, continuing the trace its job was enqueued in."""
    attributes = {
        **_messaging("process", "process", queue),
        "messaging.message.id": job,
        "oncebox.task": task,
        "oncebox.attempt": attempt,
    }
    if key is not None:
        attributes["oncebox.key"] = key
    return _span(f"process {queue}", _kind("CONSUMER"), attributes, _parent_of(stored))


def send_span(
    stored: str | None, *, channel: str, row: int, key: str, attempt: int
) -> AbstractContextManager[Traced]:
    """Around one send of an outbox row, continuing the trace of the handler that wrote it."""
    attributes = {
        **_messaging("send", "send", channel),
        "messaging.message.id": str(row),
        "oncebox.key": key,
        "oncebox.attempt": attempt,
    }
    return _span(f"send {channel}", _kind("PRODUCER"), attributes, _parent_of(stored))


def _kind(name: str) -> Any:
    return None if trace is None else getattr(SpanKind, name)


def _parent_of(stored: str | None) -> Context | None:
    return None if trace is None else _parent(stored)
