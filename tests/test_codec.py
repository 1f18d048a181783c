from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebox.codec import _encode_checked, decode_args, encode_args
from oncebox.errors import InvalidArguments, PayloadTooLarge


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
