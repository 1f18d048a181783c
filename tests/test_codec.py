from __future__ import annotations

import enum
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebox.errors import InvalidArguments, PayloadTooLarge
from oncebox.jobs.codec import _encode_checked, decode_args, encode_args


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
