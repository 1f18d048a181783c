"""OpenTelemetry: a request, the job it enqueued and the email that job wrote form one trace,
joined by the trace context each row keeps in its own column (never in the arguments)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from conftest import TEST_SECRET
from oncebox import Box, JobContext, Retry
from oncebox.providers import SendRetryable
from oncebox.testing import FrozenClock, MemoryProvider, drain
from support.db import sql
from support.spans import attributes, named, parent_of, span_id, trace_id

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
NO_DELAY = Retry(max_attempts=3, base_delay=timedelta(0), max_delay=timedelta(0))


@pytest.fixture
def mailer(store_url: str) -> Iterator[tuple[Box, MemoryProvider]]:
    box = Box(store_url, secret=TEST_SECRET)
    memory = MemoryProvider()
    box.channel("email", memory)
    failures: list[Exception] = []

    @box.task(key="digest/{customer}", retry=NO_DELAY)
    def digest(ctx: JobContext, customer: str) -> None:
        if failures:
            raise failures.pop(0)
        ctx.outbox.email(to=f"{customer}@example.com", subject="Your week", text="3 loads")

    box.failures = failures  # type: ignore[attr-defined]
    try:
        yield box, memory
    finally:
        box.close()


def stored_context(box: Box, job_id: int | None) -> tuple[str | None, str]:
    ((context, args),) = sql(
        box, "SELECT trace_context, args FROM oncebox_all_jobs WHERE id = ?", (job_id,)
    )
    return context, args if isinstance(args, str) else json.dumps(args)


def test_a_request_its_job_and_its_email_form_one_trace(mailer, spans):
    box, memory = mailer
    with trace.get_tracer("test").start_as_current_span("POST /digests") as request:
        enqueued = box.enqueue("digest", customer="acme")
    drain(box)

    assert [m["to"] for m in memory.messages()] == [["acme@example.com"]]
    (enqueue,) = named(spans.get_finished_spans(), "enqueue")
    (process,) = named(spans.get_finished_spans(), "process")
    (send,) = named(spans.get_finished_spans(), "send")
    request_context = request.get_span_context()
    assert parent_of(enqueue) == request_context.span_id
    assert parent_of(process) == span_id(enqueue)
    assert parent_of(send) == span_id(process)
    assert {trace_id(enqueue), trace_id(process), trace_id(send)} == {request_context.trace_id}

    assert (enqueue.name, enqueue.kind) == ("enqueue default", SpanKind.PRODUCER)
    assert (process.name, process.kind) == ("process default", SpanKind.CONSUMER)
    assert (send.name, send.kind) == ("send email", SpanKind.PRODUCER)
    assert attributes(enqueue)["messaging.system"] == "oncebox"
    assert attributes(enqueue)["messaging.operation.type"] == "send"
    assert attributes(enqueue)["messaging.message.id"] == str(enqueued.job_id)
    assert attributes(enqueue)["oncebox.key"] == "digest/acme"
    assert attributes(process)["messaging.operation.type"] == "process"
    assert attributes(process)["messaging.message.id"] == str(enqueued.job_id)
    assert attributes(process)["oncebox.attempt"] == 1
    assert attributes(process)["oncebox.state"] == "done"
    assert attributes(send)["messaging.destination.name"] == "email"
    assert attributes(send)["oncebox.state"] == "sent"
    assert attributes(send)["oncebox.receipt"] == "memory-1"
    assert process.status.status_code == send.status.status_code == StatusCode.UNSET


def test_the_context_is_kept_beside_the_arguments_never_in_them(mailer, spans):
    box, _memory = mailer
    with trace.get_tracer("test").start_as_current_span("request") as request:
        traced = box.enqueue("digest", customer="acme")
    plain = box.enqueue("digest", customer="globex")  # no span of the caller's: still one of ours

    context, args = stored_context(box, traced.job_id)
    assert json.loads(args) == {"customer": "acme"}
    assert context is not None
    assert f"{request.get_span_context().trace_id:032x}" in json.loads(context)["traceparent"]
    plain_context, plain_args = stored_context(box, plain.job_id)
    assert json.loads(plain_args) == {"customer": "globex"}
    assert plain_context is not None and plain_context != context
    assert traced.key == "digest/acme"  # the key is the arguments' alone


def test_each_attempt_is_a_span_under_the_enqueue_and_a_failed_one_says_why(mailer, spans):
    box, memory = mailer
    box.failures.append(ConnectionError("report service down"))
    box.enqueue("digest", customer="acme")
    drain(box, raise_on_failure=False)

    (enqueue,) = named(spans.get_finished_spans(), "enqueue")
    failed, succeeded = named(spans.get_finished_spans(), "process")
    assert parent_of(failed) == parent_of(succeeded) == span_id(enqueue)
    assert (attributes(failed)["oncebox.attempt"], attributes(succeeded)["oncebox.attempt"]) == (
        1,
        2,
    )
    assert attributes(failed)["oncebox.state"] == "ready"  # retried
    assert failed.status.status_code == StatusCode.ERROR
    assert "report service down" in (failed.status.description or "")
    assert [event.name for event in failed.events] == ["exception"]
    assert succeeded.status.status_code == StatusCode.UNSET
    (send,) = named(spans.get_finished_spans(), "send")
    assert parent_of(send) == span_id(succeeded)
    assert len(memory.messages()) == 1


def test_a_send_that_fails_is_an_error_span_and_its_retry_continues_the_same_trace(mailer, spans):
    box, memory = mailer
    memory.failures.append(SendRetryable("503 from the provider"))
    with FrozenClock(box, at=T0) as clock:
        box.enqueue("digest", customer="acme")
        drain(box, raise_on_failure=False)
        clock.advance(timedelta(hours=1))
        drain(box)

    (process,) = named(spans.get_finished_spans(), "process")
    failed, sent = named(spans.get_finished_spans(), "send")
    assert failed.status.status_code == StatusCode.ERROR
    assert "503 from the provider" in (failed.status.description or "")
    assert (attributes(failed)["oncebox.state"], attributes(sent)["oncebox.state"]) == (
        "pending",
        "sent",
    )
    assert (attributes(failed)["oncebox.attempt"], attributes(sent)["oncebox.attempt"]) == (1, 2)
    assert parent_of(failed) == parent_of(sent) == span_id(process)
    assert len(memory.messages()) == 1


def test_many_jobs_enqueued_at_once_share_one_enqueue_span(mailer, spans):
    box, _memory = mailer
    box.enqueue_many("digest", [{"customer": c} for c in ("acme", "globex", "initech")])
    box.enqueue_many("digest", [{"customer": "acme"}])  # held off by its key: counted, no job
    drain(box)

    first, second = named(spans.get_finished_spans(), "enqueue")
    assert attributes(first)["messaging.batch.message_count"] == 3
    assert attributes(first)["oncebox.created"] == 3
    assert (
        attributes(second)["messaging.batch.message_count"],
        attributes(second)["oncebox.created"],
    ) == (1, 0)
    processes = named(spans.get_finished_spans(), "process")
    assert sorted(attributes(p)["oncebox.key"] for p in processes) == [
        "digest/acme",
        "digest/globex",
        "digest/initech",
    ]
    assert {parent_of(p) for p in processes} == {span_id(first)}


def test_an_enqueue_held_off_by_its_key_says_so_on_its_span(mailer, spans):
    box, _memory = mailer
    first = box.enqueue("digest", customer="acme")
    again = box.enqueue("digest", customer="acme")

    created, held = named(spans.get_finished_spans(), "enqueue")
    assert attributes(created)["oncebox.enqueue"] == "created"
    assert attributes(held)["oncebox.enqueue"] == "active_job"
    assert attributes(held)["messaging.message.id"] == str(first.job_id) == str(again.job_id)


@pytest.mark.parametrize(
    "stored",
    ["not json", "[1, 2]", '{"traceparent": 7}', '{"traceparent": "00-zz-zz-01"}'],
)
def test_a_stored_context_nobody_can_read_starts_a_new_trace(mailer, spans, stored):
    box, memory = mailer
    job = box.enqueue("digest", customer="acme")
    sql(box, "UPDATE oncebox_jobs SET trace_context = ? WHERE id = ?", (stored, job.job_id))
    drain(box)

    (enqueue,) = named(spans.get_finished_spans(), "enqueue")
    (process,) = named(spans.get_finished_spans(), "process")
    assert parent_of(process) is None and trace_id(process) != trace_id(enqueue)
    assert len(memory.messages()) == 1


INERT = """
import sys
{block}
from oncebox import Box, JobContext
from oncebox.testing import MemoryProvider, drain

box = Box(sys.argv[1], secret="s" * 32)
memory = MemoryProvider()
box.channel("email", memory)

@box.task(key="digest/{{customer}}")
def digest(ctx: JobContext, customer: str) -> None:
    ctx.outbox.email(to="a@example.com", subject="Your week", text="3 loads")

box.enqueue("digest", customer="acme")
drain(box)
print(len(memory.messages()), box.store.job_count_by_state().counts['done'])
"""


@pytest.mark.parametrize(
    "block",
    [
        pytest.param("sys.modules['opentelemetry'] = None", id="without-the-api"),
        pytest.param("import opentelemetry.trace", id="api-without-an-sdk"),
    ],
)
def test_without_an_sdk_the_jobs_run_and_no_context_is_stored(store_url, block, tmp_path):
    script = tmp_path / "inert.py"
    script.write_text(textwrap.dedent(INERT.format(block=block)))
    done = subprocess.run(
        [sys.executable, str(script), store_url],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"]
    box = Box(store_url, secret=TEST_SECRET)
    try:
        assert sql(box, "SELECT trace_context FROM oncebox_all_jobs") == [(None,)]
        assert sql(box, "SELECT trace_context FROM oncebox_outbox") == [(None,)]
    finally:
        box.close()
