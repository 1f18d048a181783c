"""What enqueue refuses, on every store: key values that break the key rules, payloads JSON
would change or cannot carry, arguments of the wrong shape or type, instants out of range —
each a clear one-line error, with nothing written.
"""

from __future__ import annotations

import os
import unicodedata
from datetime import UTC, datetime
from typing import Any

import pytest

from oncebox import Box
from oncebox.jobs.codec import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    decode_args,
    encode_args,
)
from oncebox.jobs.keys import MAX_KEY_LENGTH
from oncebox.kernel.errors import (
    ConfigurationError,
    EnqueueError,
    InvalidArguments,
    InvalidKey,
    PayloadTooLarge,
    UnknownTask,
)
from support.rows import job_row


def jobs_written(box: Box) -> dict[str, int]:
    return box.store.job_count_by_state().counts


def test_refused_arguments_write_nothing(sqlite_url, open_box):
    box = open_box(sqlite_url)

    @box.task(key="p/{n}")
    def payload(ctx, n: int, data: Any = None) -> None:
        pass

    for data in ("\ud800", {"x": "\udcff"}, {1: "x"}, {"ok": [{None: 1}]}):
        with pytest.raises(InvalidArguments):
            box.enqueue(payload, n=1, data=data)
        with pytest.raises(InvalidArguments):
            box.enqueue_many(payload, [{"n": 2}, {"n": 3, "data": data}])
    assert jobs_written(box) == {}


T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


def deep_python(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


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

    outcomes: dict[int, bool | str] = {}
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
def test_the_default_payload_limit_is_counted_in_utf8_bytes_at_the_boundary(box: Box, char: str):
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
        stored = job_row(box, job)
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
