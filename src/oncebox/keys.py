"""Business keys: the one global namespace the guarantee hangs on.

A key names one business operation, e.g. ``weekly-digest/customer-42/2026-W33``. It is rendered
from a task's *key template* and the job's own arguments only, so every retry, take-over, replay and
redelivery of the job carries the same key. The rules are deliberately narrow, because a key is
compared byte for byte by a unique index, shown in the console and logs, and must never render two
different ways:

- ASCII only, from ``A-Z a-z 0-9`` and ``- _ . : @ + =``, with ``/`` separating segments
  (so no Unicode normalisation or case folding question can arise: two keys are equal exactly when
  their bytes are); ``~`` is reserved: it joins an intent's key and an outbox message's suffix
  (``hold-expired/hold-7~dock``), so no key can collide with another key's message;
- 1 to 255 characters, no empty segment (``a//b``, a leading or trailing ``/``), no ``.`` or ``..``
  segment;
- a template's placeholders are plain argument names (``{customer_id}``) — no attribute access,
  indexing, conversions or format specs — and each must be a parameter of the task;
- a placeholder's value must be a ``str`` or an ``int`` (not ``bool``, not ``float``: their text
  forms are ambiguous) whose text is non-empty and contains no ``/`` (a value must not be able to
  change the number of segments).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oncebox.errors import InvalidKey, KeyTemplateError

MAX_KEY_LENGTH = 255
_SEGMENT_CHARS = r"A-Za-z0-9\-_.:@+="
_SEGMENT_RE = re.compile(rf"[{_SEGMENT_CHARS}]+")
_FIELD_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BAD_SEGMENTS = frozenset({".", ".."})


def _describe(text: str, limit: int = 60) -> str:
    """A key or value quoted for an error message, shortened, control characters escaped."""
    shown = text if len(text) <= limit else text[:limit] + "…"
    return ascii(shown)


def key_problem(key: str) -> str | None:
    """Why `key` is not a valid business key, or None when it is."""
    if not isinstance(key, str):
        return f"a key must be a string, not {type(key).__name__}"
    if not key:
        return "the key is empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"the key is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}"
    for index, segment in enumerate(key.split("/")):
        if not segment:
            return f"segment {index + 1} is empty (keys have no leading, trailing or double '/')"
        if segment in _BAD_SEGMENTS:
            return f"segment {index + 1} is {segment!r}, which is not allowed"
        if not _SEGMENT_RE.fullmatch(segment):
            bad = next(ch for ch in segment if not _SEGMENT_RE.fullmatch(ch))
            return (
                f"segment {index + 1} contains {bad!a}; keys use only ASCII letters, digits "
                "and - _ . : @ + = with / between segments"
            )
    return None


def validate_key(key: str) -> str:
    """Return `key` unchanged if it is valid, else raise `InvalidKey` saying why."""
    problem = key_problem(key)
    if problem is not None:
        raise InvalidKey(f"invalid key {_describe(str(key))}: {problem}")
    return key


@dataclass(frozen=True)
class KeyTemplate:
    """A parsed key template such as ``weekly-digest/customer-{customer_id}/{period}``."""

    source: str
    parts: tuple[tuple[str, str | None], ...]

    @classmethod
    def parse(cls, source: str) -> KeyTemplate:
        """Parse and check a template; every problem is a `KeyTemplateError` at declaration."""
        if not isinstance(source, str) or not source:
            raise KeyTemplateError("a key template must be a non-empty string")
        try:
            parsed = list(string.Formatter().parse(source))
        except ValueError as exc:
            raise KeyTemplateError(f"key template {source!r} is malformed: {exc}") from None
        parts: list[tuple[str, str | None]] = []
        for literal, field, spec, conversion in parsed:
            if field is not None:
                if not _FIELD_NAME_RE.fullmatch(field):
                    raise KeyTemplateError(
                        f"key template {source!r}: placeholder {{{field}}} must be a plain "
                        "argument name (no attributes, indexes or positional fields)"
                    )
                if spec or conversion:
                    raise KeyTemplateError(
                        f"key template {source!r}: placeholder {{{field}}} may not carry a "
                        "format spec or conversion; format the value before enqueueing"
                    )
            parts.append((literal, field))
        template = cls(source=source, parts=tuple(parts))
        template._check_literal_shape()
        return template

    @property
    def fields(self) -> tuple[str, ...]:
        """The argument names the template uses, in order of first use."""
        seen: dict[str, None] = {}
        for _literal, field in self.parts:
            if field is not None:
                seen.setdefault(field, None)
        return tuple(seen)

    def _check_literal_shape(self) -> None:
        """Reject templates whose fixed text already breaks the rules (checked with stand-ins)."""
        sample = "".join(literal + ("x" if field else "") for literal, field in self.parts)
        problem = key_problem(sample)
        if problem is not None:
            raise KeyTemplateError(
                f"key template {self.source!r} cannot make a valid key: {problem}"
            )

    def render(self, args: Mapping[str, Any]) -> str:
        """The key for one job's arguments; `InvalidKey` says which value broke which rule."""
        pieces: list[str] = []
        for literal, field in self.parts:
            pieces.append(literal)
            if field is None:
                continue
            if field not in args:
                raise InvalidKey(f"key template {self.source!r} needs argument {field!r}")
            pieces.append(_render_value(self.source, field, args[field]))
        key = "".join(pieces)
        problem = key_problem(key)
        if problem is not None:
            raise InvalidKey(f"key {_describe(key)} from template {self.source!r}: {problem}")
        return key


def _render_value(template: str, field: str, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidKey(
            f"key template {template!r}: argument {field!r} is {type(value).__name__}; key "
            "arguments must be str or int"
        )
    text = str(value)
    if not text:
        raise InvalidKey(f"key template {template!r}: argument {field!r} is an empty string")
    if "/" in text:
        raise InvalidKey(
            f"key template {template!r}: argument {field!r} = {_describe(text)} contains '/', "
            "which would change the key's segments"
        )
    if not _SEGMENT_RE.fullmatch(text):
        bad = next(ch for ch in text if not _SEGMENT_RE.fullmatch(ch))
        raise InvalidKey(
            f"key template {template!r}: argument {field!r} = {_describe(text)} contains "
            f"{bad!a}; key values use only ASCII letters, digits and - _ . : @ + ="
        )
    return text
