"""A fuzz pass over the bad inputs catalogued in the reliability research (reliability.md §5,
"Bad inputs to fuzz"): business keys and key templates, JSON payloads at enqueue and at
consume, HTTP provider answers, time inputs and command-line values.

Each bad input must end in a clear error — an oncebox exception, or for a command a non-zero exit
with one line and no traceback — with nothing lost or half-written, and no worker crashed: the
next good job still completes. Cases the rest of the suite already pins (tests/test_keys.py,
test_codec.py, test_periods.py, test_http_delivery.py, test_resolver_and_providers.py, test_cli*)
are not repeated here. Every case the pass found broken (18 of them: deep nesting crashing the
consumer, NaN and duplicate names in stored arguments, colliding templates, passwords echoed,
non-ASCII digits, naive instants, …) is fixed; these tests pin the fixes.
"""

from __future__ import annotations

import enum
import getpass
import itertools
import json
import os
import sys
import threading
import unicodedata
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PG_URL
from oncebox import Box, Retry
from oncebox.cli.app import main
from oncebox.errors import (
    ConfigurationError,
    EnqueueError,
    InvalidArguments,
    InvalidKey,
    KeyTemplateError,
    PayloadTooLarge,
    UnknownTask,
)
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.jobs.codec import DEFAULT_MAX_PAYLOAD_BYTES, decode_args, encode_args
from oncebox.jobs.keys import MAX_KEY_LENGTH, KeyTemplate, validate_key
from oncebox.jobs.periods import day, in_zone, iso_week, month
from oncebox.providers import Outgoing, Receipt, from_url
from oncebox.providers.base import (
    SendAmbiguous,
    SendError,
    SendPermanent,
    SendRetryable,
    SendThrottled,
)
from oncebox.providers.http import parse_retry_after
from oncebox.queue.consumer import ConsumerResult
from oncebox.schedules.schedule import make_schedule
from oncebox.testing import FrozenClock, RedeliveringTransport, drain
from support.db import sql
from support.outbox import enqueue_customers

T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)
SECRET = "test-secret-not-for-production"


def jobs_written(box: Box) -> dict[str, int]:
    return box.store.job_count_by_state().counts


def deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


def deep_python(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


# ==============================================================================================
# 1. Business keys and key templates
# ==============================================================================================

CONTROL_CHARS = [chr(c) for c in [*range(0x20), 0x7F]]
BIDI_CHARS = [chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]]
ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\ufeff"]

# Values a caller might pass for a key placeholder; every one must be refused at enqueue.
# (NUL is refused by the payload rules first — it cannot be stored — which is also an EnqueueError.)
BAD_KEY_VALUES: list[str] = [
    "",
    " ",
    "\t",
    " x",
    "x ",
    "/",
    "//",
    "x/",
    "a/b",
    ".",
    "..",
    "%2F",
    "%00",
    "%0d%0a",
    *(f"a{ch}b" for ch in CONTROL_CHARS),
    "a\u2028b",
    "a\u2029b",
    *(f"a{ch}b" for ch in BIDI_CHARS),
    *(f"a{ch}b" for ch in ZERO_WIDTH),
    unicodedata.normalize("NFC", "café"),
    unicodedata.normalize("NFD", "café"),
    "a\uff0fb",  # full-width solidus: not a separator, not allowed either
    "p\u0430ypal",  # Cyrillic a
    "\u0435x",  # Cyrillic e
    "f\u043eo",  # Cyrillic o
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # ZWJ family emoji
    "'",
    '"',
    ";",
    "/*",
    "*/",
    "\\",
    "%",
    "x' OR '1'='1",
    "1; DROP TABLE oncebox_jobs; --",
    "{}",
    "%s",
    "{0.__class__}",
    "{customer_id}",
    "k" * (MAX_KEY_LENGTH - 1),  # "k/" + 254 = 256 characters
    "k" * MAX_KEY_LENGTH,  # 257
    "k" * 10**5,
]


def test_every_catalogued_bad_key_value_is_refused_and_nothing_is_written(box: Box):
    @box.task(key="k/{v}")
    def keyed(ctx, v: str) -> None:
        pass

    accepted: list[str] = []
    for value in BAD_KEY_VALUES:
        for attempt in (
            lambda v=value: box.enqueue(keyed, v=v),
            lambda v=value: box.enqueue_many(keyed, [{"v": "fine"}, {"v": v}]),
        ):
            try:
                attempt()
            except (InvalidKey, InvalidArguments) as exc:
                message = str(exc)
                assert "\n" not in message and "\r" not in message, ascii(message)
                assert len(message) < 500, len(message)  # a 10^5-character value is cut
            else:
                accepted.append(ascii(value[:40]))
    assert accepted == []
    assert jobs_written(box) == {}
    assert box.store.intent_count() == 0


def test_key_lengths_at_the_edges(box: Box):
    @box.task(key="{v}")
    def bare(ctx, v: str) -> None:
        pass

    outcomes = {}
    for length in (0, 1, MAX_KEY_LENGTH, MAX_KEY_LENGTH + 1, MAX_KEY_LENGTH + 2, 10**5):
        try:
            outcomes[length] = box.enqueue(bare, v="k" * length).created
        except InvalidKey:
            outcomes[length] = "refused"
    assert outcomes == {
        0: "refused",
        1: True,
        MAX_KEY_LENGTH: True,
        MAX_KEY_LENGTH + 1: "refused",
        MAX_KEY_LENGTH + 2: "refused",
        10**5: "refused",
    }
    assert jobs_written(box) == {"ready": 2}


def test_allowed_punctuation_is_matched_exactly_never_as_a_wildcard(box: Box):
    """`_` and `%` are LIKE wildcards in SQL: a lookup by key must be byte-for-byte."""

    @box.task(key="k/{v}")
    def keyed(ctx, v: str) -> None:
        pass

    for value in ("abc", "a_c", "a.c", "a:c", "a@c", "a+c", "a=c", "a-c", "--", "_"):
        assert box.enqueue(keyed, v=value).created
    assert [job.key for job in box.find("k/a_c")] == ["k/a_c"]
    with pytest.raises(InvalidKey):
        box.find("k/a%")  # a pattern is not a key


@pytest.mark.parametrize(
    "template",
    [
        "k/{0.__class__}",
        "k/{v.__class__.__mro__}",
        "k/{v[0]}",
        "k/{v:{w}}",
        "k/{v!s}",
        "k/{v!a:>3}",
        "k/{__import__}",  # a plain name, but not a parameter of the handler
        "k/%(v)s",
        "k/${v}",
        "k/{v}\n",
        "k/\u202e{v}",
    ],
)
def test_a_template_that_could_format_more_than_a_value_is_refused_and_not_registered(
    sqlite_url, open_box, template
):
    box = open_box(sqlite_url)
    with pytest.raises(KeyTemplateError):

        @box.task(key=template)
        def keyed(ctx, v: str, w: str = "") -> None:
            pass

    assert box.registry.names() == []


@given(st.text(alphabet=st.sampled_from("{}!:.[]0ax_/- %$\n") | st.characters(), max_size=30))
def test_parsing_any_template_text_either_succeeds_or_raises_key_template_error(source):
    try:
        template = KeyTemplate.parse(source)
    except KeyTemplateError:
        return
    assert all(field.isidentifier() for field in template.fields)
    validate_key(template.render(dict.fromkeys(template.fields, "x")))


@given(st.text(max_size=300))
def test_validate_key_returns_the_key_unchanged_or_refuses_with_a_one_line_ascii_message(text):
    try:
        key = validate_key(text)
    except InvalidKey as exc:
        message = str(exc)
        assert message.isascii() and "\n" not in message and "\r" not in message
        assert len(message) < 1000
        return
    assert key == text and key.isascii() and 1 <= len(key) <= MAX_KEY_LENGTH


_SEGMENT = st.text(alphabet=st.sampled_from("abcXYZ019-_.:@+="), min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)


@given(st.tuples(_SEGMENT, _SEGMENT), st.tuples(_SEGMENT, _SEGMENT))
def test_one_placeholder_per_segment_gives_different_keys_for_different_arguments(a, b):
    template = KeyTemplate.parse("report/customer-{customer}/{period}")
    keys = [template.render({"customer": c, "period": p}) for c, p in (a, b)]
    assert (keys[0] == keys[1]) == (a == b)


@pytest.mark.parametrize(
    ("template", "first", "second"),
    [
        ("k/{x}{y}", {"x": "1", "y": "23"}, {"x": "12", "y": "3"}),
        ("k/{x}-{y}", {"x": "a-b", "y": "c"}, {"x": "a", "y": "b-c"}),
    ],
)
def test_different_arguments_never_share_a_key(sqlite_url, open_box, template, first, second):
    box = open_box(sqlite_url)
    try:

        @box.task(key=template)
        def pair(ctx, x: str, y: str) -> None:
            pass

    except KeyTemplateError:
        return  # refusing the ambiguous template is a correct fix too
    assert box.enqueue_args(pair, first).created
    assert box.enqueue_args(pair, second).created


class Region(str, enum.Enum):  # noqa: UP042 (a StrEnum would hide the bug)
    EU = "eu"


def test_a_str_enum_argument_renders_the_same_key_as_its_stored_value(sqlite_url, open_box):
    box = open_box(sqlite_url)

    @box.task(key="k/{region}")
    def regional(ctx, region: str) -> None:
        pass

    first = box.enqueue(regional, region=Region.EU)
    again = box.enqueue(regional, region="eu")
    assert first.key == "k/eu"
    assert not again.created


@pytest.mark.parametrize("template", ["k/{a\nb}", "k/{a\u202eb}"])
def test_a_template_error_message_is_one_printable_line(template):
    with pytest.raises(KeyTemplateError) as caught:
        KeyTemplate.parse(template)
    assert str(caught.value).isprintable()


# ==============================================================================================
# 2. Payloads (JSON): at enqueue
# ==============================================================================================


class Opaque:
    pass


BAD_PAYLOAD_VALUES: list[tuple[str, Any]] = [
    ("nan", float("nan")),
    ("inf", float("inf")),
    ("-inf", float("-inf")),
    ("1e400", float("1e400")),
    ("deep-list-10^4", deep_python(10**4)),
    ("deep-33-in-a-mapping", {"a": deep_python(33)}),
    ("int-10^4-digits", 10**10_000),
    ("bytes", b"\x00\xff"),
    ("set", {1, 2}),
    ("object", Opaque()),
    ("datetime", T0),
    ("tuple-key", {(1, 2): 3}),
    ("nul-in-value", "a\x00b"),
    ("nul-in-name", {"a\x00": 1}),
]


def test_unencodable_payloads_are_refused_at_enqueue_and_nothing_is_written(box: Box):
    @box.task(key="p/{n}")
    def payload(ctx, n: int, data: Any = None) -> None:
        pass

    accepted = []
    for label, value in BAD_PAYLOAD_VALUES:
        try:
            box.enqueue(payload, n=1, data=value)
        except InvalidArguments as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 500, (label, str(exc)[:200])
        else:
            accepted.append(label)
        with pytest.raises(InvalidArguments):
            box.enqueue_many(payload, [{"n": 2, "data": 1}, {"n": 3, "data": value}])
    assert accepted == []
    assert jobs_written(box) == {}


@pytest.mark.parametrize("data", [{1: "x"}, {1.5: "x"}, {None: "x"}, {True: "x"}])
def test_nested_mappings_with_non_string_keys_are_refused(sqlite_url, open_box, data):
    box = open_box(sqlite_url)

    @box.task(key="p/{n}")
    def payload(ctx, n: int, data: Any = None) -> None:
        pass

    with pytest.raises(InvalidArguments):
        box.enqueue(payload, n=1, data=data)
    assert jobs_written(box) == {}


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([1, 2], "do not fit"),  # a top-level array instead of an object
        (None, "do not fit"),
        ("n=1", "do not fit"),
        ({1: 1}, "do not fit"),
        ({"n": 42.0}, "must be int, not float"),  # an integer-looking float for an id
        ({"n": "42"}, "must be int, not str"),
        ({"n": True}, "must be int, not bool"),
        ({"n": None}, "must be int, not NoneType"),
    ],
)
def test_arguments_of_the_wrong_shape_or_type_are_refused_and_nothing_is_written(
    sqlite_url, open_box, args, why
):
    box = open_box(sqlite_url)

    @box.task(key="p/{n}")
    def payload(ctx, n: int) -> None:
        pass

    with pytest.raises(InvalidArguments, match=why):
        box.enqueue_args(payload, args)
    with pytest.raises(InvalidArguments, match=why):
        box.enqueue_many(payload, [{"n": 1}, args])
    assert jobs_written(box) == {}


@pytest.mark.parametrize("char", ["€", "\U0001f4e6"], ids=["3-byte", "4-byte"])
def test_the_default_payload_limit_is_counted_in_utf8_bytes_at_the_boundary(box: Box, char):
    @box.task
    def blob(ctx, body: str) -> None:
        pass

    overhead = len('{"body":""}')
    width = len(char.encode())
    multibyte = (DEFAULT_MAX_PAYLOAD_BYTES - overhead - 1000) // width

    def body(total_bytes: int) -> str:
        return char * multibyte + "x" * (total_bytes - overhead - multibyte * width)

    assert len(body(DEFAULT_MAX_PAYLOAD_BYTES + 1)) < DEFAULT_MAX_PAYLOAD_BYTES // 2  # chars
    for total in (DEFAULT_MAX_PAYLOAD_BYTES - 1, DEFAULT_MAX_PAYLOAD_BYTES):
        job = box.enqueue(blob, body=body(total)).job_id
        stored = box.store.job_get(job)
        assert decode_args(stored.args_json) == {"body": body(total)}
    limit = DEFAULT_MAX_PAYLOAD_BYTES
    with pytest.raises(PayloadTooLarge, match=rf"are {limit + 1} bytes as JSON; the limit is"):
        box.enqueue(blob, body=body(limit + 1))
    with pytest.raises(PayloadTooLarge):
        box.enqueue_many(blob, [{"body": "small"}, {"body": body(limit + 1)}])
    assert jobs_written(box) == {"ready": 2}


def test_sql_and_format_metacharacters_in_a_payload_are_stored_verbatim(box: Box):
    @box.task(key="p/{n}")
    def payload(ctx, n: int, note: str) -> None:
        pass

    notes = [
        "x'; DROP TABLE oncebox_jobs; --",
        '" OR 1=1 /* */ \\',
        "%s %(n)s %% _ ?",
        "{0.__class__} {} {n}",
        "<script>alert(1)</script>",
        "\u202eevil\u2028line",
    ]
    for n, note in enumerate(notes):
        box.enqueue(payload, n=n, note=note)
    stored = [decode_args(box.find(f"p/{n}")[0].args_json)["note"] for n in range(len(notes))]
    assert stored == notes
    assert jobs_written(box) == {"ready": len(notes)}


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "__import__", "", "../tasks"])
def test_unknown_task_names_that_look_like_import_paths_are_refused_and_never_imported(
    sqlite_url, open_box, monkeypatch, name
):
    def explode(*_args: Any) -> int:
        raise AssertionError("a task name was resolved as an import path")

    monkeypatch.setattr(os, "system", explode)
    box = open_box(sqlite_url)
    with pytest.raises(UnknownTask, match="no task named"):
        box.enqueue(name, command="touch /tmp/pwned")
    with pytest.raises(UnknownTask):
        box.enqueue_many(name, [{"command": "true"}])
    assert jobs_written(box) == {}


@pytest.mark.parametrize("value", ["\ud800", "ok\udcff"])
def test_a_lone_surrogate_in_the_arguments_is_invalid_arguments(sqlite_url, open_box, value):
    box = open_box(sqlite_url)

    @box.task(key="p/{n}")
    def payload(ctx, n: int, note: str) -> None:
        pass

    with pytest.raises(InvalidArguments):
        encode_args({"note": value}, "payload", DEFAULT_MAX_PAYLOAD_BYTES)
    with pytest.raises(EnqueueError):
        box.enqueue(payload, n=1, note=value)
    assert jobs_written(box) == {}


# ==============================================================================================
# 2. Payloads (JSON): at consume — a broken stored job dies at once; the worker goes on
# ==============================================================================================


@pytest.fixture
def sqlite_box(sqlite_url, open_box) -> Box:
    """For what does not depend on the store (the broker path, decoding): SQLite only."""
    return open_box(sqlite_url, seed=1234, secret=SECRET)


def declare_victim(box: Box, ran: list[tuple[Any, ...]]) -> None:
    @box.task(key="fuzz/{n}", name="fuzz_t", retry=Retry(max_attempts=5))
    def fuzz_t(ctx, n: int, note: Any = None) -> None:
        ran.append((n, note))


def consume_with_poison(
    box: Box, args_json: str, task: str = "fuzz_t"
) -> tuple[RedeliveringTransport, ConsumerResult]:
    """A broker delivers a corrupted message, then a good one (n=2); run the consumer until the
    broker is empty (or 4 rounds)."""
    broker = RedeliveringTransport(copies=1)
    poison = broker.publish("fuzz_t", n=1)
    good = broker.publish("fuzz_t", n=2)
    broker._messages[poison].args_json = args_json
    broker._messages[poison].task = task
    broker._ready[:] = [good, poison]  # the poison is fetched first
    consumer = box.consumer(transport=broker)
    result = ConsumerResult()
    try:
        for _ in range(4):
            if not broker.pending:
                break
            result.add(consumer.run_once())
    finally:
        consumer.session.close()
    return broker, result


BROKEN_STORED_ARGS = [
    ("not-json", "not json", "not JSON"),
    ("empty", "", "not JSON"),
    ("truncated", '{"n": 1', "not JSON"),
    ("trailing-garbage", '{"n": 1} x', "not JSON"),
    ("bom", '\ufeff{"n": 1}', "not JSON"),
    ("null", "null", "not a JSON object"),
    ("array", "[1]", "not a JSON object"),
    ("string", '"n=1"', "not a JSON object"),
    ("number", "5", "not a JSON object"),
    ("int-10^4-digits", '{"n": ' + "1" * 10**4 + "}", "not JSON"),
    ("int-as-string", '{"n": "1"}', "must be int, not str"),
    ("int-looking-float", '{"n": 1.0}', "must be int, not float"),
    ("int-overflowing-to-inf", '{"n": 1e400}', "must be int, not float"),
    ("extra-argument", '{"n": 1, "os": "system"}', "unexpected keyword argument 'os'"),
    ("missing-argument", '{"note": 1}', "missing a required argument: 'n'"),
    ("control-valid", '{"n": -1, "note": null}', None),  # valid: renders 'fuzz/-1' and runs
]


@pytest.mark.parametrize(
    ("args_json", "needle"),
    [pytest.param(a, n, id=i) for i, a, n in BROKEN_STORED_ARGS],
)
def test_a_delivery_with_broken_args_dies_at_once_and_the_next_job_completes(
    sqlite_box: Box, args_json, needle
):
    ran: list[tuple[Any, ...]] = []
    declare_victim(sqlite_box, ran)
    broker, result = consume_with_poison(sqlite_box, args_json)
    assert broker.pending == 0
    if needle is None:  # the control case: a valid message runs normally
        assert dict(broker.acks) == {"m1": "completed", "m2": "completed"}
        assert sorted(ran) == [(-1, None), (2, None)]
        return
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    [failure] = result.failures
    assert failure.final and needle in failure.error, failure.error
    assert "InvalidArguments" in failure.error
    assert ran == [(2, None)]


@pytest.mark.parametrize("task", ["os.system", "builtins.eval", "subprocess.run"])
def test_a_delivery_of_an_unknown_task_dies_without_importing_anything(
    sqlite_box: Box, monkeypatch, task
):
    box = sqlite_box

    def explode(*_args: Any) -> int:
        raise AssertionError("a delivered task name was resolved as an import path")

    monkeypatch.setattr(os, "system", explode)
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, result = consume_with_poison(box, '{"command": "touch /tmp/pwned"}', task=task)
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    [failure] = result.failures
    assert f"UnknownTask: no task named {task!r}" in failure.error
    assert ran == [(2, None)]


@pytest.mark.parametrize("levels", [10**3, 10**4])
def test_a_delivery_with_deeply_nested_args_dies_at_once(sqlite_box: Box, levels):
    box = sqlite_box
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, result = consume_with_poison(box, '{"n": 1, "note": ' + deep_json(levels) + "}")
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    assert "InvalidArguments" in result.failures[0].error


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_delivery_with_a_non_finite_number_dies_at_once(sqlite_box: Box, literal):
    box = sqlite_box
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, _result = consume_with_poison(box, '{"n": 1, "note": ' + literal + "}")
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    assert ran == [(2, None)]


def test_a_delivery_with_duplicated_argument_names_dies_at_once(sqlite_box: Box):
    box = sqlite_box
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, _result = consume_with_poison(box, '{"n": 1, "n": 3}')
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    assert ran == [(2, None)]


def corrupt_stored_args(box: Box, job_id: int, args_json: str) -> None:
    cast = "?" if box.store.dialect == "sqlite" else "?::jsonb"
    sql(box, f"UPDATE oncebox_jobs SET args = {cast} WHERE id = ?", (args_json, job_id))


def run_worker_over_poison(box: Box, poisons: dict[str, str]) -> dict[int, str]:
    """Enqueue one job per poison (n=1..) and a good one (n=99), corrupt the poisons' stored
    args, run a real worker until idle; return {job id: needle} for the poisons."""
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    expected: dict[int, str] = {}
    for n, (args_json, needle) in enumerate(poisons.items(), start=1):
        job_id = box.enqueue("fuzz_t", n=n).job_id
        assert job_id is not None
        corrupt_stored_args(box, job_id, args_json)
        expected[job_id] = needle
    good = box.enqueue("fuzz_t", n=99).job_id
    result = box.work(until_idle=True)
    for job_id, needle in expected.items():
        dead = box.store.job_get(job_id)
        assert (dead.state, dead.attempt) == ("dead", 1), (job_id, dead.state)
        assert needle in dead.last_error, dead.last_error
    done = box.store.job_get(good)
    assert (done.state, done.outcome) == ("done", "completed")
    assert (result.consumed.dead, result.consumed.completed) == (len(poisons), 1)
    assert ran == [(99, None)]
    assert box.store.intent_count() == 1
    return expected


def test_stored_jobs_with_broken_args_are_dead_and_the_worker_keeps_going(box: Box):
    """Values a jsonb column can hold too, so both stores: each poison dies on its first
    attempt, naming its problem, and the worker completes the good job."""
    run_worker_over_poison(
        box,
        {
            "null": "not a JSON object",
            "[1]": "not a JSON object",
            '"text"': "not a JSON object",
            '{"n": "1"}': "must be int, not str",
            '{"n": 1, "extra": 2}': "unexpected keyword argument 'extra'",
        },
    )


@pytest.mark.parametrize(
    ("args_json", "needle"),
    [
        pytest.param("not json", "not JSON", id="not-json"),
        pytest.param('\ufeff{"n": 1}', "not JSON", id="bom"),
        pytest.param('{"n": ' + "9" * 10**4 + "}", "not JSON", id="int-10^4-digits"),
        pytest.param(
            '{"n": ' + deep_json(10**4) + "}",
            "InvalidArguments",
            id="deep-nesting",
        ),
    ],
)
def test_a_stored_text_that_is_not_json_is_dead_and_the_worker_keeps_going(
    sqlite_box: Box, args_json, needle
):
    """SQLite keeps args as text, so damage can be anything (PostgreSQL's jsonb refuses it)."""
    run_worker_over_poison(sqlite_box, {args_json: needle})


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["n", "note", "x", ""]), inner, max_size=3)
    ),
    max_leaves=8,
)
_STORED_ARGS = st.one_of(
    st.text(max_size=40),
    _JSON_VALUES.map(json.dumps),
    st.builds(lambda value, cut: json.dumps(value)[:cut], _JSON_VALUES, st.integers(0, 30)),
    st.sampled_from([a for _i, a, _n in BROKEN_STORED_ARGS]),
)


def test_any_stored_args_text_settles_its_delivery_and_costs_the_next_job_nothing(sqlite_url):
    box = Box(sqlite_url, secret=SECRET)
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    good_ids = itertools.count(10**6)
    try:

        @settings(max_examples=60, deadline=None)
        @given(_STORED_ARGS)
        def check(args_json: str) -> None:
            broker = RedeliveringTransport(copies=1)
            poison = broker.publish("fuzz_t", n=1)
            good = broker.publish("fuzz_t", n=next(good_ids))
            broker._messages[poison].args_json = args_json
            broker._ready[:] = [good, poison]
            consumer = box.consumer(transport=broker)
            try:
                consumer.run_once()
            finally:
                consumer.session.close()
            acks = dict(broker.acks)
            assert broker.pending == 0
            assert acks[good] == "completed"
            assert acks[poison] in {"dead", "completed", "duplicate"}

        check()
    finally:
        box.close()


# ==============================================================================================
# 3. Provider answers: HTTP status codes, bodies and Retry-After
# ==============================================================================================

OUTGOING = Outgoing(
    1,
    "email",
    "a" * 32,
    {
        "to": ["x@y.example"],
        "from": "digest@oncebox.example",
        "subject": "s",
        "text": "t",
        "date": "Mon, 17 Aug 2026 09:00:00 +0000",
        "headers": {},
    },
    1,
)
RESPONSE_DATE = "Mon, 17 Aug 2026 09:00:00 GMT"


def send_once(url: str) -> Receipt | SendError:
    """One send through the real HTTP client; a SendError is returned, anything else raised."""
    provider = from_url(f"{url}?timeout=5")
    try:
        return provider.send(OUTGOING, "idem-key-1")
    except SendError as exc:
        return exc
    finally:
        provider.close()  # type: ignore[attr-defined]


@contextmanager
def canned_http(
    status: int, headers: tuple[tuple[str, str], ...] = (), body: bytes = b""
) -> Iterator[tuple[str, list[str]]]:
    """A one-answer HTTP server on loopback, for answers the fake API cannot give (an empty
    200, a 204, a redirect elsewhere, duplicated or obsolete-format headers). Its Date header is
    fixed at RESPONSE_DATE."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

        def date_time_string(self, timestamp: float | None = None) -> str:
            return RESPONSE_DATE

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            hits.append(self.path)
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            has_body = status not in (204, 304)
            if has_body and not any(n.lower() == "content-length" for n, _v in headers):
                self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if has_body:
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"resend+http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def api() -> Iterator[FakeEmailApi]:
    with FakeEmailApi() as server:
        yield server


STATUS_CLASSES: list[tuple[int, type]] = [
    (201, Receipt),
    (202, Receipt),
    (301, SendPermanent),  # never followed
    (400, SendPermanent),
    (401, SendThrottled),  # credentials: every message alike, so the channel pauses
    (403, SendThrottled),
    (404, SendPermanent),
    (408, SendRetryable),
    (409, SendRetryable),  # an unknown 409 code reads as "in progress"
    (410, SendPermanent),
    (413, SendPermanent),
    (415, SendPermanent),
    (422, SendPermanent),
    (429, SendThrottled),
    (500, SendRetryable),
    (502, SendRetryable),
    (503, SendRetryable),
    (504, SendRetryable),
    (520, SendRetryable),
    (599, SendRetryable),
]


@pytest.mark.parametrize(
    ("status", "expected"), STATUS_CLASSES, ids=[str(s) for s, _ in STATUS_CLASSES]
)
def test_every_catalogued_status_is_classified(api, status, expected):
    api.script(str(status))
    outcome = send_once(api.url)
    assert type(outcome) is expected, outcome
    if isinstance(outcome, SendError):
        assert f"HTTP {status}" in outcome.reason
    assert api.delivered == []


def test_a_425_too_early_is_retried_not_dead(api):
    api.script("425")
    assert isinstance(send_once(api.url), (SendRetryable, SendThrottled))


@pytest.mark.parametrize(
    ("status", "headers", "body", "provider_id"),
    [
        (200, (), b"", None),  # an empty 200
        (200, (("Content-Type", "application/json"),), b'{"id": "m-1"', None),  # truncated
        (200, (("Content-Type", "text/html"),), b"<html>ok</html>", None),
        (200, (("Content-Type", "application/json; charset=no-such-charset"),), b'{"id":"m"}', "m"),
        (200, (("Content-Type", "application/json"),), b"\xff\xfe{\x00", None),  # not UTF-8
        (200, (("Content-Type", "application/json"),), b'{"id": 5}', None),  # id not a string
        (200, (("Content-Type", "application/json"),), b'{"message": "ok"}', None),  # no id
        (200, (("Content-Type", "application/json"),), b" " * (10 * 1024 * 1024), None),
        (201, (("Content-Type", "application/json"),), b'{"id": "m-2"}', "m-2"),
        (204, (), b"", None),
    ],
    ids=[
        "200-empty",
        "200-truncated-json",
        "200-html",
        "200-unknown-charset",
        "200-not-utf8",
        "200-numeric-id",
        "200-missing-id",
        "200-10MiB",
        "201-with-id",
        "204",
    ],
)
def test_odd_success_bodies_are_receipts(status, headers, body, provider_id):
    with canned_http(status, headers, body) as (url, hits):
        outcome = send_once(url)
    assert isinstance(outcome, Receipt), outcome
    assert outcome.provider_id == provider_id
    assert len(outcome.detail) <= 600  # a 10 MiB body is not copied into the receipt
    assert hits == ["/emails"]


def test_a_response_shorter_than_its_content_length_is_ambiguous():
    headers = (("Content-Length", "100"), ("Content-Type", "application/json"))
    with canned_http(200, headers, b'{"id": "cut"}') as (url, _hits):
        assert isinstance(send_once(url), SendAmbiguous)


def test_a_deeply_nested_success_body_is_still_a_classified_answer():
    headers = (("Content-Type", "application/json"),)
    with canned_http(200, headers, deep_json(10**4).encode()) as (url, _hits):
        assert isinstance(send_once(url), (Receipt, SendError))


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308, 304])
def test_a_redirect_is_never_followed_to_another_host(status):
    with canned_http(200, (("Content-Type", "application/json"),), b'{"id": "x"}') as (
        elsewhere,
        stolen,
    ):
        location = elsewhere.replace("resend+http", "http") + "/emails"
        with canned_http(status, (("Location", location),)) as (url, hits):
            outcome = send_once(url)
    assert isinstance(outcome, SendPermanent) and f"HTTP {status}" in outcome.reason
    assert (hits, stolen) == (["/emails"], [])


@pytest.mark.parametrize(
    ("action", "retry_after"),
    [
        ("429:0", timedelta(0)),
        ("429:-5", timedelta(0)),
        ("429:1.5", timedelta(seconds=1.5)),
        ("429:120", timedelta(seconds=120)),
        ("429:999999999", timedelta(seconds=999_999_999)),  # the channel caps it
        ("429:garbage", None),  # the channel's default pause
        ("429:date:-3600", timedelta(0)),  # an HTTP-date in the past
        ("429:date:315360000", timedelta(days=3650)),  # an HTTP-date ten years on
        ("503:-5", timedelta(0)),
        ("503:garbage", None),
        ("503:120", timedelta(seconds=120)),
    ],
)
def test_retry_after_values_on_the_wire_are_parsed_never_raised(api, action, retry_after):
    api.script(action)
    outcome = send_once(api.url)
    expected = SendThrottled if action.startswith("429") else SendRetryable
    assert type(outcome) is expected, outcome
    assert outcome.retry_after == retry_after  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("headers", "retry_after"),
    [
        ((("Retry-After", "Monday, 17-Aug-26 09:02:00 GMT"),), timedelta(minutes=2)),  # RFC 850
        ((("Retry-After", "Mon Aug 17 09:02:00 2026"),), timedelta(minutes=2)),  # asctime
        ((("Retry-After", "30"), ("Retry-After", "60")), timedelta(seconds=30)),  # duplicated
        ((("Retry-After", ""),), None),
        ((("Retry-After", "Mon, 17 Aug 10000 09:00:00 GMT"),), None),  # year out of range
        ((("Retry-After", "1e308"),), timedelta(days=36500)),
    ],
    ids=["rfc850", "asctime", "duplicated", "empty", "year-10000", "1e308"],
)
def test_obsolete_and_duplicated_retry_after_headers(headers, retry_after):
    with canned_http(429, headers) as (url, _hits):
        outcome = send_once(url)
    assert isinstance(outcome, SendThrottled)
    assert outcome.retry_after == retry_after


@given(st.text(max_size=60), st.one_of(st.none(), st.text(max_size=40)))
def test_parse_retry_after_never_raises_and_never_goes_negative(value, date_header):
    wait = parse_retry_after(value, date_header)
    assert wait is None or wait >= timedelta(0)


@pytest.mark.parametrize(
    ("header", "pause"),
    [
        ("0", timedelta(seconds=1)),  # "0" must not mean "hammer the provider"
        ("-5", timedelta(seconds=1)),
        ("1.5", timedelta(seconds=1.5)),
        ("garbage", timedelta(seconds=60)),  # default_throttle
        ("date:-3600", timedelta(seconds=1)),
        ("date:315360000", timedelta(hours=1)),  # capped at max_pause
    ],
)
def test_a_429s_retry_after_becomes_a_bounded_pause_that_spends_no_attempt(
    api, sqlite_url, mail_box, header, pause
):
    box = mail_box(sqlite_url, api.url)
    api.script(f"429:{header}")
    with FrozenClock(box, at=T0):
        enqueue_customers(box, [1])
        result = drain(box, raise_on_failure=False)
    [row] = box.store.outbox_find_by_key("weekly-digest/customer-1/2026-W33")
    assert (result.dispatched.throttled, result.dispatched.dead) == (1, 0)
    assert (row.state, row.attempt) == ("pending", 0)
    assert row.next_attempt_at - T0 == pause


# ==============================================================================================
# 4. Time inputs
# ==============================================================================================


@pytest.mark.parametrize(
    "tz",
    [
        "",
        "localtime",
        "LocalTime",
        "/etc/localtime",
        "../../etc/passwd",
        "Europe/../UTC",
        "UTC\x00",
        "Europe/Berlin ",
        "\u202eUTC",
        "utc+2",
        None,
        5,
    ],
)
def test_a_schedule_in_a_bad_timezone_is_refused_and_not_registered(sqlite_url, open_box, tz):
    box = open_box(sqlite_url)

    @box.task(key="digest/{period}")
    def digest(ctx, period: str) -> None:
        pass

    with pytest.raises(ConfigurationError, match="timezone"):
        box.schedule("weekly", cron="0 9 * * MON", period=iso_week, task="digest", tz=tz)(
            lambda ctx: []
        )
    assert box.schedules == {}


def test_naive_or_out_of_range_run_at_is_refused_and_nothing_is_written(box: Box):
    @box.task(key="t/{n}")
    def timed(ctx, n: int) -> None:
        pass

    for run_at, why in [
        (datetime(2026, 8, 17, 9, 0), "timezone-aware"),
        (datetime(1969, 12, 31, 23, 59, tzinfo=UTC), "outside 1970-9000"),
        (datetime(9999, 12, 31, tzinfo=UTC), "outside 1970-9000"),
    ]:
        with pytest.raises(ConfigurationError, match=why):
            box.enqueue(timed, n=1, run_at=run_at)
        with pytest.raises(ConfigurationError, match=why):
            box.enqueue_many(timed, [{"n": 1}, {"n": 2}], run_at=run_at)
    assert jobs_written(box) == {}


def weekly_box(box: Box) -> None:
    @box.task(key="digest/customer-{customer_id}/{period}")
    def digest(ctx, customer_id: int, period: str) -> None:
        pass

    @box.schedule("weekly", cron="0 9 * * MON", period=iso_week, task="digest")
    def eligible(ctx):
        yield {"customer_id": 1, "period": ctx.period}


def test_a_manual_run_for_a_malformed_week_is_refused_and_writes_no_run_or_job(box: Box):
    weekly_box(box)
    for period in [
        "2026-W00",
        "2026-W54",
        "2027-W53",
        "2026-W5",
        "2026W33",
        "2026-w33",
        "+2026-W33",
        "10000-W01",
        " 2026-W33",
        "2026-W33\n",
        "2026-W-1",
        "",
        "2026-W33/x",
        "2026-08-17",
    ]:
        with pytest.raises(InvalidArguments, match="period"):
            box.run_schedule("weekly", period)
    assert box.store.schedule_run_list("weekly") == []
    assert jobs_written(box) == {}


@given(st.from_regex(r"[0-9]{4}-W[0-9]{2}", fullmatch=True).filter(lambda p: p[:4] != "0000"))
def test_a_week_text_is_either_refused_or_a_real_week_usable_in_a_key(text):
    try:
        checked = iso_week.check(text)
    except InvalidArguments:
        return
    validate_key(f"digest/{checked}")
    monday = datetime.fromisocalendar(int(text[:4]), int(text[-2:]), 1).replace(tzinfo=UTC)
    assert iso_week(monday) == text


def test_year_zero_is_invalid_arguments(sqlite_url, open_box):
    box = open_box(sqlite_url, secret=SECRET)
    weekly_box(box)
    with pytest.raises(InvalidArguments, match="0000-W01"):
        box.run_schedule("weekly", "0000-W01")


@pytest.mark.parametrize(
    "period", ["\u0662\u0660\u0662\u0666-W33", "\uff12\uff10\uff12\uff16-W33", "2026-W\u0663\u0663"]
)
def test_non_ascii_digits_in_a_week_are_refused_before_anything_is_written(
    sqlite_url, open_box, period
):
    box = open_box(sqlite_url, secret=SECRET)
    weekly_box(box)
    with pytest.raises(InvalidArguments):
        box.run_schedule("weekly", period)
    assert box.store.schedule_run_list("weekly") == []


def test_non_ascii_digits_in_a_month_are_refused():
    with pytest.raises(InvalidArguments):
        month.check("\u0662\u0660\u0662\u0666-\u0660\u0668")


def test_non_ascii_digits_in_a_day_are_refused():
    with pytest.raises(InvalidArguments):
        day.check("\u0662\u0660\u0662\u0666-\u0660\u0668-\u0661\u0667")


NAIVE = datetime(2026, 8, 17, 9, 0)


@pytest.mark.parametrize("call", ["in_zone", "period_of", "fires_between"])
def test_naive_instants_are_refused_wherever_an_aware_one_is_expected(call):
    weekly = make_schedule(
        "s", cron="0 9 * * MON", tz="Europe/Berlin", period=iso_week, task="t", eligible=list
    )
    actions = {
        "in_zone": lambda: in_zone(iso_week, "Pacific/Auckland")(NAIVE),
        "period_of": lambda: weekly.period_of(NAIVE),
        "fires_between": lambda: weekly.fires_between(NAIVE, NAIVE + timedelta(days=8)),
    }
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        actions[call]()


# ==============================================================================================
# 5. Command-line values (in process, with click's runner)
# ==============================================================================================


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_refused(result: Result, code: int, *needles: str) -> str:
    """Exit `code`, no traceback, one error line (click's usage errors add their usage hint and
    one `Error:` line); returns that line."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit), result.exc_info  # nothing escaped
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if lines and lines[0].startswith("Usage:"):
        errors = [line for line in lines if line.startswith("Error:")]
        assert len(errors) == 1, result.stderr
        message = errors[0]
    else:
        assert len(lines) == 1, result.stderr
        message = lines[0]
    for needle in needles:
        assert needle in message, message
    return message


@pytest.fixture
def cli_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    Box(url).close()
    return url


LIST_COMMANDS = [("jobs", "list"), ("dlq", "list"), ("outbox", "list"), ("audit", "list")]


@pytest.mark.parametrize("limit", ["-1", "0", "1e9", "abc", "1000000000", "", "1.5", "0x10"])
def test_a_bad_limit_is_a_usage_error_on_every_listing(cli_db, limit):
    for command in LIST_COMMANDS:
        assert_refused(invoke(*command, "--limit", limit, "--db", cli_db), 2, "'--limit'")


def test_limits_at_the_bounds_are_accepted(cli_db):
    for command in LIST_COMMANDS:
        for limit in ("1", "100000"):
            result = invoke(*command, "--limit", limit, "--db", cli_db, "--json")
            assert (result.exit_code, json.loads(result.stdout)) == (0, []), result.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("frobnicate",), "No such command 'frobnicate'"),
        (("jobs", "frobnicate"), "No such command 'frobnicate'"),
        (("--frob",), "No such option '--frob'"),
        (("jobs", "list", "--frob"), "No such option '--frob'"),
        (("jobs", "list", "--limit"), "'--limit' requires an argument"),
        (("dlq", "replay", "--all", "--reason", "x", "--frob"), "No such option '--frob'"),
        (("status", "--periods", "many"), "'--periods'"),
    ],
)
def test_unknown_commands_and_flags_exit_2_without_a_traceback(args, needle):
    assert_refused(invoke(*args), 2, needle)


@pytest.mark.parametrize(
    "command",
    [("jobs", "show"), ("outbox", "show"), ("dlq", "replay", "--reason", "x")],
    ids=["jobs-show", "outbox-show", "dlq-replay"],
)
def test_a_superscript_digit_id_is_a_usage_error(cli_db, command):
    assert_refused(invoke(*command[:2], "\u00b2", *command[2:], "--db", cli_db), 2, "no ")


@pytest.mark.parametrize(
    ("db", "needle"),
    [
        ("mysql://bob:s3cret@127.0.0.1/db", "scheme 'mysql' is not supported"),
        ("http://bob:s3cret@127.0.0.1/db", "scheme 'http' is not supported"),
        ("postgresql://bob:s3cret@127.0.0.1:1/db?pool_max=many", "must be numbers"),
    ],
)
def test_a_dsn_with_a_wrong_scheme_or_option_is_a_usage_error_without_the_password(db, needle):
    for command in (("status",), ("migrate",)):
        message = assert_refused(invoke(*command, "--db", db), 2, needle)
        assert "s3cret" not in message


def pg_dsn(user: str, password: str, database: str) -> str:
    parts = psycopg.conninfo.conninfo_to_dict(PG_URL)
    host, port = parts.get("host", "127.0.0.1"), parts.get("port", 5432)
    return f"postgresql://{user}:{password}@{host}:{port}/{database}?connect_timeout=3"


@pytest.mark.postgres
def test_a_bad_password_or_user_is_a_one_line_runtime_error_that_never_echoes_it(pg_template):
    dsn = pg_dsn("oncebox_fuzz_nobody", "s3cr%40t", pg_template)
    for command in (("status",), ("migrate",), ("jobs", "list")):
        message = assert_refused(invoke(*command, "--db", dsn), 1, "***@")
        assert "s3cr" not in message


@pytest.mark.postgres
def test_a_missing_database_is_a_one_line_runtime_error(pg_template):
    user = psycopg.conninfo.conninfo_to_dict(PG_URL).get("user") or getpass.getuser()
    missing = f"oncebox_no_such_db_{uuid.uuid4().hex[:6]}"
    dsn = pg_dsn(str(user), "s3cret", missing)
    for command in (("status",), ("migrate",)):
        message = assert_refused(invoke(*command, "--db", dsn), 1, f'"{missing}" does not exist')
        assert "s3cret" not in message


@pytest.mark.parametrize(
    "db",
    [
        "postgresql://127.0.0.1:1/db?password=s3cret&connect_timeout=2",
        "host=127.0.0.1 port=1 password=s3cret dbname=db",
    ],
    ids=["query-parameter", "keyword-dsn"],
)
def test_a_password_anywhere_in_the_dsn_is_never_echoed(db):
    result = invoke("status", "--db", db)
    assert result.exit_code in (1, 2)
    assert "s3cret" not in result.output


@pytest.mark.parametrize(
    "db",
    ["postgresql://bob:s3cret@[::1/db", "postgresql://bob:s3cret@127.0.0.1:notaport/db"],
    ids=["unclosed-ipv6", "non-numeric-port"],
)
def test_a_malformed_postgresql_url_is_a_usage_error(db):
    message = assert_refused(invoke("migrate", "--db", db), 2)
    assert "s3cret" not in message


def test_a_hostless_postgresql_url_reaches_the_server_it_names():
    result = invoke("status", "--db", "postgresql:///db?host=127.0.0.1&port=1&connect_timeout=2")
    assert_refused(result, 1, "Connection refused")


APP_SOURCE = """
from oncebox import Box

box = Box()  # reads ONCEBOX_DB


@box.task(key="note/{name}")
def note(ctx, name: str, count: int = 0, data=None) -> None:
    pass
"""


@pytest.fixture
def cli_app(tmp_path: Path, monkeypatch) -> Iterator[str]:
    """An app module under a fresh name (the in-process import cache must not hand one test
    another test's Box), with the environment a user would export; yields the database URL."""
    name = f"fuzz_app_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE)
    url = f"sqlite:///{tmp_path / 'app.db'}"
    Box(url).close()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app prepends the cwd
    monkeypatch.setenv("ONCEBOX_DB", url)  # load_app may set it: restored afterwards
    monkeypatch.setenv("ONCEBOX_APP", name)
    monkeypatch.delenv("ONCEBOX_EMAIL", raising=False)
    yield url
    module = sys.modules.pop(name, None)
    if module is not None:
        module.box.close()


def jobs_in(url: str) -> dict[str, int]:
    box = Box(url)
    try:
        return jobs_written(box)
    finally:
        box.close()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("note", "name=a", "data=NaN"), "not JSON"),
        (("note", "name=a", "data=-Infinity"), "not JSON"),
        (("note", "name=a", "data=1e400"), "not JSON"),
        (("note", "name=a", "data=" + "[" * 40 + "]" * 40), "nested deeper than 32"),
        (("note", "name=a\u202eb"), "\\u202e"),
        (("note", "name=a\x1b[31mred"), "\\x1b"),
        (("note", "name=" + "x" * 10**5), "limit is 255"),
        (("note", "name={0.__class__}"), "'{'"),
        (("note", "name=%s"), "'%'"),
        (("note", "name=a", "count=1e3"), "is an int"),
        (("os.system", "command=true"), "no task named 'os.system'"),
        (("builtins.eval", "source=1"), "no task named 'builtins.eval'"),
    ],
)
def test_cli_enqueue_refuses_bad_values_on_one_line_and_writes_nothing(cli_app, args, needle):
    message = assert_refused(invoke("enqueue", *args), 2, needle)
    assert len(message) < 500 and message.isprintable()
    assert jobs_in(cli_app) == {}


@pytest.mark.parametrize(
    "args",
    [
        ("note", "name=a", "data=" + deep_json(10**4)),
        ("note", "name=a", "count=" + "1" * 5000),
        ("note", "name=\udcff"),
        ("note", "name=a", 'data={"x": 1, "x": 2}'),
    ],
    ids=["deep-json", "huge-int", "lone-surrogate", "duplicate-names"],
)
def test_cli_enqueue_refuses_hostile_values_as_usage_errors(cli_app, args):
    assert_refused(invoke("enqueue", *args), 2)
    assert jobs_in(cli_app) == {}
