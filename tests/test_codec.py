from __future__ import annotations

import enum
import json
import math
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebox.jobs.codec import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_DEPTH,
    _encode_checked,
    check_finite,
    decode_args,
    encode_args,
    parse_args,
)
from oncebox.kernel.errors import InvalidArguments, PayloadTooLarge


def test_arguments_encode_canonically():
    assert encode_args({"b": 1, "a": [1, "é"]}, "t", 1000) == '{"a":[1,"é"],"b":1}'
    assert decode_args('{"a":1}') == {"a": 1}


def test_the_limit_is_measured_in_utf8_bytes_and_names_size_and_limit():
    payload = {"s": "é" * 10}  # 20 bytes of text, 10 characters
    encoded = encode_args(payload, "t", 1000)
    limit = len(encoded.encode()) - 1
    with pytest.raises(PayloadTooLarge, match=rf"{limit + 1} bytes as JSON; the limit is {limit}"):
        encode_args(payload, "t", limit)
    assert encode_args(payload, "t", limit + 1) == encoded


@pytest.mark.parametrize(
    "args",
    [
        {"x": math.nan},
        {"x": math.inf},
        {"x": object()},
        {"x": b"bytes"},
        {1: "non-string name"},
        {"x": "a\x00b"},
        {"a\x00": 1},
        {"x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
    ],
)
def test_non_json_arguments_are_refused(args):
    with pytest.raises(InvalidArguments):
        encode_args(args, "t", 10_000)


def test_stored_arguments_must_be_an_object():
    with pytest.raises(InvalidArguments):
        decode_args("[1, 2]")


_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and the infinities included: both paths must refuse them
    st.text(),  # NUL, lone surrogates and non-ASCII included
)


@settings(max_examples=400)
@given(args=st.dictionaries(st.text(max_size=8), _SCALAR, max_size=5), limit=st.integers(2, 120))
def test_the_flat_argument_shortcut_encodes_and_refuses_exactly_as_the_full_checks(args, limit):
    """Flat arguments skip the nested walks; the text they get, and every refusal with its
    message, must be what the full checks give."""

    def outcome(encode):
        try:
            return encode(args, "t", limit)
        except (InvalidArguments, PayloadTooLarge) as exc:
            return type(exc), str(exc)

    assert outcome(encode_args) == outcome(_encode_checked)


@given(
    rows=st.lists(
        st.tuples(
            st.none() | st.booleans() | st.integers() | st.text(),
            st.floats(allow_nan=False, allow_infinity=False),
        ),
        max_size=5,
    )
)
def test_rows_sent_to_postgresql_as_json_read_back_as_written(rows):
    """The consumer's sets go to PostgreSQL as one JSON text (`_json_rows`): every cell must
    parse back to itself — a bool not as an int, a str with any character, a float exactly."""
    from oncebox.store.postgres import _json_rows

    text = _json_rows(rows)
    assert [tuple(row) for row in json.loads(text)] == rows
    assert text.isascii()


def test_json_rows_splice_json_text_and_refuse_what_json_cannot_carry():
    from oncebox.store.postgres import _Json, _json_rows

    class Shade(enum.IntEnum):
        DARK = 7

    assert json.loads(_json_rows([(_Json('{"a":[1,2]}'), Shade.DARK)])) == [[{"a": [1, 2]}, 7]]
    with pytest.raises(ValueError):
        _json_rows([(math.nan,)])


_ids = st.none() | st.integers(min_value=0, max_value=2**63 - 1)
_texts = st.text()


@given(
    claims=st.lists(st.tuples(_texts, _texts, _ids), max_size=4),
    finishes=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2**63 - 1),
            st.sampled_from(["done", "ready", "dead"]),
            st.none() | st.sampled_from(["completed", "duplicate"]),
            st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=400)),
            st.none() | _texts,
        ),
        max_size=4,
    ),
    rows=st.lists(
        st.tuples(_texts, _texts, _texts, st.dictionaries(_texts, _texts), _texts, _ids),
        max_size=4,
    ),
    context=st.none() | _texts,
)
def test_the_consumers_sets_are_written_as_json_rows_writes_their_cells(
    claims, finishes, rows, context
):
    """The claim's, settlement's and outbox rows' sets have their own writers on the
    consumer's path (one format per row): each gives the very text `_json_rows` gives."""
    from oncebox.store import postgres
    from oncebox.store.params import IntentClaim, JobFinish, OutboxInsert

    made = [IntentClaim(*claim) for claim in claims]
    assert postgres._claim_rows(made) == postgres._json_rows(claims)
    settled = [JobFinish(*finish) for finish in finishes]
    cells = [(f.id, f.state, f.outcome, f.delay.total_seconds(), f.error) for f in settled]
    assert postgres._finish_rows(settled) == postgres._json_rows(cells)
    written = [
        OutboxInsert(key, intent, channel, json.dumps(payload), token, job_id, context)
        for key, intent, channel, payload, token, job_id in rows
    ]
    spliced = [
        (r.key, r.intent_key, r.channel, postgres._Json(r.payload_json), r.token, r.job_id, context)
        for r in written
    ]
    assert postgres._outbox_rows(written) == postgres._json_rows(spliced)


def nested(levels: int, inner: str = "") -> str:
    return "[" * levels + inner + "]" * levels


# -- decoding: what encode_args never writes is refused --------------------------------------
@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1_000, 100_000])
def test_stored_arguments_nested_too_deeply_are_invalid_arguments_not_a_recursion_error(levels):
    with pytest.raises(InvalidArguments, match="nested"):
        decode_args('{"n": 1, "note": ' + nested(levels) + "}")


def test_encoding_and_decoding_draw_the_depth_line_in_the_same_place():
    deepest = {"note": json.loads(nested(MAX_DEPTH))}
    assert decode_args(encode_args(deepest, "t", DEFAULT_MAX_PAYLOAD_BYTES)) == deepest
    with pytest.raises(InvalidArguments, match=f"nested deeper than {MAX_DEPTH}"):
        encode_args({"note": json.loads(nested(MAX_DEPTH + 1))}, "t", DEFAULT_MAX_PAYLOAD_BYTES)


@pytest.mark.parametrize(
    "number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", '[1, {"x": NaN}]']
)
def test_a_non_finite_number_anywhere_in_stored_arguments_is_refused(number):
    with pytest.raises(InvalidArguments, match=r"'note'|not a JSON value"):
        decode_args('{"n": 1, "note": {"deep": [' + number + "]}}")


def test_finite_extremes_round_trip():
    args = {"big": 1.7976931348623157e308, "tiny": 5e-324, "neg": -0.0, "int": 10**300}
    assert decode_args(encode_args(args, "t", DEFAULT_MAX_PAYLOAD_BYTES)) == args


def test_the_type_check_can_run_before_the_finiteness_check():
    """The consumer parses, checks the handler's types, then finiteness: `{"n": 1e400}` for an
    `n: int` then names the parameter's type rather than only the number."""
    parsed = parse_args('{"n": 1e400}')
    assert math.isinf(parsed["n"])
    with pytest.raises(InvalidArguments, match="'n' holds a number that is not finite"):
        check_finite(parsed)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ('{"n": 1, "n": 3}', "'n'"),
        ('{"n": 1, "note": {"a": 1, "b": 2, "a": 1}}', "'a'"),
        ('{"n": 1, "note": [{"x": [{"y": 1, "y": 1}]}]}', "'y'"),
    ],
)
def test_a_name_given_twice_at_any_depth_is_refused(text, name):
    with pytest.raises(InvalidArguments, match=f"name {name} twice"):
        decode_args(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"n": 1',
        b'{"n": "\xff"}',  # not UTF-8
        '{"n": ' + "1" * 5000 + "}",  # more digits than int() reads
    ],
)
def test_unreadable_stored_text_is_invalid_arguments(text):
    with pytest.raises(InvalidArguments, match="not JSON"):
        decode_args(text)


# -- encoding: what JSON would change or cannot carry is refused ------------------------------
@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"note": "\ud800"}, "'note'"),
        ({"note": ["ok", {"x": "a\udcffb"}]}, "'note'"),
        ({"note": {"\udcff": 1}}, "'note'"),
        ({"\ud800": 1}, "'\\\\ud800'"),
    ],
)
def test_a_lone_surrogate_is_invalid_arguments_naming_the_argument(args, named):
    with pytest.raises(InvalidArguments, match=f"argument {named} of task 'mail'") as caught:
        encode_args(args, "mail", DEFAULT_MAX_PAYLOAD_BYTES)
    assert str(caught.value).isascii() and "lone surrogate" in str(caught.value)


@pytest.mark.parametrize(
    "data", [{1: "x"}, {"ok": [{2.5: "x"}]}, {"ok": {"deeper": {None: 1}}}, {False: "x"}]
)
def test_a_nested_mapping_key_that_is_not_a_string_is_refused(data):
    with pytest.raises(InvalidArguments, match="argument 'data' of task 't' holds a mapping"):
        encode_args({"data": data}, "t", DEFAULT_MAX_PAYLOAD_BYTES)


class Region(str, enum.Enum):  # noqa: UP042 (a StrEnum's str() is its value: no bug to pin)
    EU = "eu"


class Shade(enum.IntEnum):
    DARK = 7


def test_two_mapping_keys_written_as_the_same_name_are_refused():
    class Loose(str):
        """Equal to nothing else, so a dict keeps it beside the plain "eu"."""

        def __eq__(self, other: object) -> bool:
            return self is other

        def __hash__(self) -> int:
            return id(self)

    with pytest.raises(InvalidArguments, match="two keys written as 'eu'"):
        encode_args({"data": {Loose("eu"): 1, "eu": 2}}, "t", DEFAULT_MAX_PAYLOAD_BYTES)


def test_enum_mapping_keys_and_values_are_stored_as_their_values():
    text = encode_args({"data": {Region.EU: Shade.DARK}}, "t", DEFAULT_MAX_PAYLOAD_BYTES)
    assert decode_args(text) == {"data": {"eu": 7}}
