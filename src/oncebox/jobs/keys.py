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
- at most one placeholder per segment: within a segment the boundary between two values is lost
  (``k/{x}{y}`` renders ``k/123`` for x="1", y="23" and for x="12", y="3"; ``k/{x}-{y}`` renders
  ``k/a-b-c`` for x="a-b", y="c" and for x="a", y="b-c"), so a second operation would be skipped
  as already done; no value can hold ``/``, so ``k/{x}/{y}`` cannot collide;
- a placeholder's value must be a ``str`` or an ``int`` (not ``bool``, not ``float``: their text
  forms are ambiguous) whose text is non-empty and contains no ``/`` (a value must not be able to
  change the number of segments).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from oncebox.kernel.errors import ConfigurationError, InvalidKey, KeyTemplateError

MAX_KEY_LENGTH = 255
_SEGMENT_CHARS = r"A-Za-z0-9\-_.:@+="
_SEGMENT_RE = re.compile(rf"[{_SEGMENT_CHARS}]+")
_FIELD_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BAD_SEGMENTS = frozenset({".", ".."})
# A key every rule accepts, save the ones about "." segments and the length, in one match: the
# common case costs one regex instead of one per segment (key_problem says why for the rest).
_PLAIN_KEY_RE = re.compile(rf"[{_SEGMENT_CHARS}]+(?:/[{_SEGMENT_CHARS}]+)*")


def _describe(text: str, limit: int = 60) -> str:
    """A key or value quoted for an error message, shortened, control characters escaped."""
    shown = text if len(text) <= limit else text[:limit] + "…"
    return ascii(shown)


def quote_template(template: str) -> str:
    """A template quoted for an error message: one line, every non-ASCII or control character
    escaped (a newline or a bidi override must not reach a log line raw), long ones shortened."""
    return _describe(template, limit=300)


def key_problem(key: str) -> str | None:
    """Why `key` is not a valid business key, or None when it is."""
    if not isinstance(key, str):
        return f"a key must be a string, not {type(key).__name__}"
    plain = len(key) <= MAX_KEY_LENGTH and _PLAIN_KEY_RE.fullmatch(key)
    if plain and "/." not in key and not key.startswith("."):
        return None  # no segment can be "." or ".."
    return _rule_broken(key)


def _rule_broken(key: str) -> str | None:
    """The first rule `key` breaks, checked one by one (None: it breaks none)."""
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
        quoted = quote_template(source)
        try:
            parsed = list(string.Formatter().parse(source))
        except ValueError as exc:
            raise KeyTemplateError(f"key template {quoted} is malformed: {exc}") from None
        parts: list[tuple[str, str | None]] = []
        in_segment: list[str] = []  # the placeholders of the segment being read
        for literal, field, spec, conversion in parsed:
            if "/" in literal:
                in_segment = []
            if field is not None:
                shown = _describe("{" + field + "}")
                if not _FIELD_NAME_RE.fullmatch(field):
                    raise KeyTemplateError(
                        f"key template {quoted}: placeholder {shown} must be a plain "
                        "argument name (no attributes, indexes or positional fields)"
                    )
                if spec or conversion:
                    raise KeyTemplateError(
                        f"key template {quoted}: placeholder {shown} may not carry a "
                        "format spec or conversion; format the value before enqueueing"
                    )
                in_segment.append(field)
                if len(in_segment) > 1:
                    first, second = in_segment[0], in_segment[1]
                    raise KeyTemplateError(_shared_segment(quoted, first, second, literal))
            parts.append((literal, field))
        template = cls(source=source, parts=tuple(parts))
        template._check_literal_shape()
        return template

    @cached_property
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
                f"key template {quote_template(self.source)} cannot make a valid key: {problem}"
            )

    def render(self, args: Mapping[str, Any]) -> str:
        """The key for one job's arguments; `InvalidKey` says which value broke which rule."""
        pieces: list[str] = []
        for literal, field in self.parts:
            pieces.append(literal)
            if field is None:
                continue
            if field not in args:
                raise InvalidKey(
                    f"key template {quote_template(self.source)} needs argument {field!r}"
                )
            pieces.append(_render_value(self.source, field, args[field]))
        key = "".join(pieces)
        problem = key_problem(key)
        if problem is not None:
            raise InvalidKey(
                f"key {_describe(key)} from template {quote_template(self.source)}: {problem}"
            )
        return key


def argument_template(
    where: str, label: str, source: str, parameters: set[str] | None
) -> KeyTemplate:
    """A template over a handler's arguments that is not its key (a limit's partition, a
    debounce's `by`), by a key's rules; each placeholder must be one of `parameters` (None: the
    handler takes **kwargs). Mistakes are `ConfigurationError`s saying `where` and `label`."""
    try:
        template = KeyTemplate.parse(source)
    except KeyTemplateError as exc:
        raise ConfigurationError(f"{where}: {label}: {exc}") from None
    missing = [f for f in template.fields if parameters is not None and f not in parameters]
    if missing:
        raise ConfigurationError(
            f"{where}: {label} {quote_template(source)} uses {', '.join(missing)}, "
            "which the handler does not take as parameters"
        )
    return template


def _shared_segment(quoted: str, first: str, second: str, between: str) -> str:
    """Why two placeholders may not share a segment, with two arguments that collide."""
    advice = f"use one placeholder per segment, e.g. '.../{{{first}}}/{{{second}}}'"
    if first == second:
        return f"key template {quoted}: {{{first}}} appears twice in one segment; {advice}"
    pair = f"{{{first}}}{between}{{{second}}}"
    return (
        f"key template {quoted}: {{{first}}} and {{{second}}} share one segment, so different "
        f"arguments can render the same key ({_describe(pair)} reads "
        f"{_describe(f'a{between}b{between}c')} for {first}={_describe(f'a{between}b')}, "
        f"{second}='c' and for {first}='a', {second}={_describe(f'b{between}c')}) and the "
        f"second operation would be skipped as already done; {advice}"
    )


def _render_value(source: str, field: str, value: object) -> str:
    """`field`'s value as key text, or `InvalidKey` naming the rule it breaks."""

    def refused(why: str) -> InvalidKey:
        return InvalidKey(f"key template {quote_template(source)}: argument {field!r} {why}")

    if type(value) is int:
        return str(value)  # digits, perhaps a leading "-": always a valid segment
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise refused(f"is {type(value).__name__}; key arguments must be str or int")
    text = str(value)
    if not text:
        raise refused("is an empty string")
    if "/" in text:
        raise refused(f"= {_describe(text)} contains '/', which would change the key's segments")
    if not _SEGMENT_RE.fullmatch(text):
        bad = next(ch for ch in text if not _SEGMENT_RE.fullmatch(ch))
        raise refused(
            f"= {_describe(text)} contains {bad!a}; key values use only ASCII letters, digits "
            "and - _ . : @ + ="
        )
    return text
