"""Job arguments as JSON, and only JSON.

No pickle anywhere: whoever can write to a queue that unpickles can run code in every worker.
Arguments are a JSON object of keyword arguments, encoded compactly with sorted keys (so the same
arguments always give the same bytes), without NaN or Infinity (not JSON), nested at most
`MAX_DEPTH` levels, and no larger than the configured byte limit measured on the UTF-8 encoding.
Jobs should carry ids and look data up in the handler; the limit keeps them honest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from oncebox.errors import InvalidArguments, PayloadTooLarge

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
MAX_DEPTH = 32

_encoder = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def _check_depth(value: object, task: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise InvalidArguments(f"arguments of task {task!r} are nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for item in value.values():
            _check_depth(item, task, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_depth(item, task, depth + 1)


def has_nul(value: object) -> bool:
    """Whether any string (or name) in a JSON-like value holds a NUL character, which
    PostgreSQL cannot keep in text or jsonb — refused everywhere, so both stores agree."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_nul(item) for item in value)
    return False


def encode_args(args: Mapping[str, Any], task: str, max_bytes: int) -> str:
    """The canonical JSON text of `args`; raises before anything is written if it cannot be."""
    if not isinstance(args, Mapping):
        raise InvalidArguments(f"arguments of task {task!r} must be a mapping of names to values")
    for name in args:
        if not isinstance(name, str):
            raise InvalidArguments(f"argument names of task {task!r} must be strings, got {name!r}")
    _check_depth(args, task)
    try:
        text = _encoder.encode(dict(args))
    except (TypeError, ValueError) as exc:
        raise InvalidArguments(f"arguments of task {task!r} are not JSON: {exc}") from None
    if has_nul(args):
        raise InvalidArguments(
            f"arguments of task {task!r} contain a NUL character, which no store keeps in text"
        )
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise PayloadTooLarge(size=size, limit=max_bytes, task=task)
    return text


def decode_args(text: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
    """Arguments read back from the store (already decoded on drivers that parse JSON)."""
    value = dict(text) if isinstance(text, Mapping) else json.loads(text)
    if not isinstance(value, dict):
        raise InvalidArguments("stored arguments are not a JSON object")
    return value
