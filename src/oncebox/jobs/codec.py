"""Job arguments as JSON, and only JSON.

No pickle anywhere: whoever can write to a queue that unpickles can run code in every worker.
Arguments are a JSON object of keyword arguments, encoded compactly with sorted keys (so the same
arguments always give the same bytes), without NaN or Infinity (not JSON), nested at most
`MAX_DEPTH` levels, and no larger than the configured byte limit measured on the UTF-8 encoding.
Jobs should carry ids and look data up in the handler; the limit keeps them honest.

Arguments must come back as they were written. So encoding refuses what JSON would silently
change or could not carry: a mapping key that is not a string (``{1: "x"}`` would come back as
``{"1": "x"}``), two keys with the same text, a lone surrogate (not Unicode text, so no UTF-8).
Decoding refuses whatever encoding never produces, so a damaged or hand-written message dies with
its problem named instead of running with a value nobody wrote: NaN and Infinity, a number too
large for a float, a name given twice (``{"n": 1, "n": 3}`` — readers disagree on which wins),
nesting deeper than `MAX_DEPTH` (and nesting so deep the parser itself would overflow).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from oncebox.kernel.errors import InvalidArguments, PayloadTooLarge

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
MAX_DEPTH = 32

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def _preview(value: object, limit: int = 40) -> str:
    """A value quoted for a one-line message: shortened, every non-ASCII character escaped."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_shape(value: object, task: str, name: str, depth: int = 1) -> None:
    """Refuse, naming the argument, what JSON cannot carry back unchanged: nesting deeper than
    `MAX_DEPTH`, a mapping key that is not a string, two keys with the same text."""
    if depth > MAX_DEPTH:
        raise InvalidArguments(f"arguments of task {task!r} are nested deeper than {MAX_DEPTH}")
    if isinstance(value, Mapping):
        texts: set[str] = set()
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArguments(
                    f"argument {_preview(name)} of task {task!r} holds a mapping with the key "
                    f"{_preview(key)} ({type(key).__name__}); JSON names are strings, so it "
                    "would not come back as written"
                )
            text = str.__str__(key)  # what JSON writes for a str subclass (an enum member)
            if text in texts:
                raise InvalidArguments(
                    f"argument {_preview(name)} of task {task!r} holds a mapping with two keys "
                    f"written as {_preview(text)}"
                )
            texts.add(text)
            _check_shape(item, task, name, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_shape(item, task, name, depth + 1)


def _has(value: object, found: Any) -> bool:
    """Whether `found(text)` holds for any string or name in a JSON-like value."""
    if isinstance(value, str):
        return bool(found(value))
    if isinstance(value, Mapping):
        return any(_has(k, found) or _has(v, found) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has(item, found) for item in value)
    return False


def has_nul(value: object) -> bool:
    """Whether any string (or name) in a JSON-like value holds a NUL character, which
    PostgreSQL cannot keep in text or jsonb — refused everywhere, so both stores agree."""
    return _has(value, lambda text: "\x00" in text)


def _not_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


_SCALARS = frozenset({str, int, float, bool, type(None)})


def encode_args(args: Mapping[str, Any], task: str, max_bytes: int) -> str:
    """The canonical JSON text of `args`; raises before anything is written if it cannot be."""
    if type(args) is dict and all(
        type(name) is str and type(value) in _SCALARS for name, value in args.items()
    ):
        # The common case, flat arguments of exact scalar types: nothing nested to walk, and
        # the text shows the rest — JSON escapes NUL as \u0000, and ASCII text is valid UTF-8
        # of its own length. Anything else takes the full checks below for their messages.
        try:
            text = _encoder.encode(args)
        except ValueError:
            pass  # NaN or Infinity: the full checks name it
        else:
            if text.isascii() and "\\u0000" not in text:
                if len(text) > max_bytes:
                    raise PayloadTooLarge(size=len(text), limit=max_bytes, task=task)
                return text
    return _encode_checked(args, task, max_bytes)


def _encode_checked(args: Mapping[str, Any], task: str, max_bytes: int) -> str:
    if not isinstance(args, Mapping):
        raise InvalidArguments(f"arguments of task {task!r} must be a mapping of names to values")
    for name in args:
        if not isinstance(name, str):
            raise InvalidArguments(
                f"argument names of task {task!r} must be strings, got {_preview(name)}"
            )
    for name, value in args.items():
        _check_shape(value, task, name)
    try:
        text = _encoder.encode(dict(args))
    except (TypeError, ValueError) as exc:
        raise InvalidArguments(
            f"arguments of task {task!r} are not JSON: {_preview(str(exc), 200)}"
        ) from None
    if has_nul(args):
        raise InvalidArguments(
            f"arguments of task {task!r} contain a NUL character, which no store keeps in text"
        )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        culprit = next(
            (name for name, value in args.items() if _not_utf8(name) or _has(value, _not_utf8)),
            "?",
        )
        raise InvalidArguments(
            f"argument {_preview(culprit)} of task {task!r} holds a lone surrogate (text that "
            "is not valid Unicode, e.g. undecodable bytes), which cannot be stored as UTF-8"
        ) from None
    if size > max_bytes:
        raise PayloadTooLarge(size=size, limit=max_bytes, task=task)
    return text


# -- reading back ------------------------------------------------------------------------------


def _refuse_constant(literal: str) -> NoReturn:
    raise InvalidArguments(f"stored arguments are not JSON: {literal} is not a JSON value")


def _object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)  # in C; a name given twice shows as a dict shorter than its pairs
    if len(value) != len(pairs):
        seen: set[str] = set()
        for name, _item in pairs:
            if name in seen:
                raise InvalidArguments(
                    f"stored arguments give the name {_preview(name)} twice; readers would "
                    "disagree on which value counts"
                )
            seen.add(name)
    return value


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, object_pairs_hook=_object_once)
_SCAN: Callable[[str, int], tuple[object, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def _check_stored_depth(value: object, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise InvalidArguments(f"stored arguments are nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        items: Iterable[object] = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return
    for item in items:  # a scalar below the deepest level allowed is too deep as well
        if depth >= MAX_DEPTH or isinstance(item, (dict, list)):
            _check_stored_depth(item, depth + 1)


def parse_args(text: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """Stored arguments as a dict, refusing what is not one JSON object as `encode_args` writes
    it — except a non-finite number, which `check_finite` refuses (see `decode_args`)."""
    value: object
    if type(text) is not str and isinstance(text, Mapping):  # a driver that parses JSON itself
        value = dict(text)
    else:
        try:
            if isinstance(text, str) and not text.startswith("\ufeff"):
                # the decoder's own scanner first (`decode` is it plus two whitespace
                # matches); text with whitespace around its value, or anything after it, is
                # read (or refused) by `decode` itself. json.loads would build a decoder per call
                try:
                    value, end = _SCAN(text, 0)
                except StopIteration:  # no value where the text begins
                    end = -1
                if end != len(text):
                    value = _DECODER.decode(text)
            else:
                value = json.loads(
                    text, parse_constant=_refuse_constant, object_pairs_hook=_object_once
                )
        except RecursionError:
            raise InvalidArguments(
                f"stored arguments are nested too deeply to read (the limit is {MAX_DEPTH})"
            ) from None
        except ValueError as exc:  # a decode error, bytes that are not UTF-8, a huge integer
            raise InvalidArguments(
                f"stored arguments are not JSON: {_preview(str(exc), 200)}"
            ) from None
    if not isinstance(value, dict):
        raise InvalidArguments("stored arguments are not a JSON object")
    _check_stored_depth(value)
    return value


def _non_finite(value: object) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_non_finite(item) for item in value.values())
    if isinstance(value, list):
        return any(_non_finite(item) for item in value)
    return False


def check_finite(args: Mapping[str, Any]) -> None:
    """Refuse a non-finite number anywhere in parsed arguments (1e400 reads as infinity)."""
    for name, value in args.items():
        if isinstance(value, (float, dict, list)) and _non_finite(value):
            raise InvalidArguments(
                f"stored argument {_preview(name)} holds a number that is not finite (NaN, "
                "Infinity, or too large for a float)"
            )


def decode_args(text: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """Arguments read back from the store (already decoded on drivers that parse JSON); raises
    `InvalidArguments` for anything `encode_args` would not have written.

    The consumer runs the two halves apart (`parse_args`, then the task's own checks, then
    `check_finite`), so that ``{"n": 1e400}`` for an ``n: int`` names the parameter's type."""
    args = parse_args(text)
    check_finite(args)
    return args
