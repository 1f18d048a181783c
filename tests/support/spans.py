"""Spans recorded in memory by the OpenTelemetry SDK, for tests that read what oncebox traced.

The SDK's global tracer provider can be set only once per process: it is set the first time a
test records, and from then on every span ends in a processor that passes it to the in-memory
exporter only while a test is recording (the `spans` fixture) — the rest of the suite keeps
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class _WhileRecording(SpanProcessor):
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.on = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.exporter.export((span,))


_switch: _WhileRecording | None = None


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """Spans ended inside the block, in an exporter emptied when the block begins."""
    global _switch  # noqa: PLW0603 (one per process, like the provider it feeds)
    if _switch is None:
        _switch = _WhileRecording()
        provider = TracerProvider()
        provider.add_span_processor(_switch)
        trace.set_tracer_provider(provider)
    _switch.exporter.clear()
    _switch.on = True
    try:
        yield _switch.exporter
    finally:
        _switch.on = False


def named(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    """The spans whose name starts with `prefix` ("enqueue", "process", "send"), in end order."""
    return [span for span in spans if span.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    """The id of the span's parent, None for a root."""
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def trace_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id


def attributes(span: ReadableSpan) -> Mapping[str, Any]:
    return span.attributes or {}
