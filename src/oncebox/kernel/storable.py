"""What a store can keep, checked where values arrive from outside — the console's filters and
forms, the API's paths and bodies, the providers' events, the CLI's ids — so a value no store
keeps is refused there, saying what is wrong and where, instead of reaching the database and
failing as a driver's error (a 500 with a traceback, a provider retrying for ever).

- Text: PostgreSQL's `text` holds no NUL (U+0000), and neither store can encode a lone surrogate
  (U+D800-U+DFFF, what JSON's `"\\ud800"` escape and Python's `surrogateescape` make) as UTF-8.
  SQLite would keep a NUL; it is refused on both, so both stores answer alike. (What oncebox
  writes of its own — a handler's error, a provider's reply — is escaped instead, not refused:
  `storable_text` below.)
- Row ids: PostgreSQL's `bigint` and SQLite's `INTEGER` stop at 2^63 - 1; an id is ASCII digits
  (`str.isdigit()` is true of '²' too, which `int()` refuses).
"""

from __future__ import annotations

import re

from oncebox.kernel.errors import InvalidInput

MAX_ROW_ID = 2**63 - 1
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_DIGITS = re.compile("[0-9]+")


def text_problem(text: str) -> str | None:
    """Why no store can keep `text` ("holds a NUL character (U+0000)", …), or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return "holds a NUL character (U+0000)"
    return f"holds a lone surrogate (U+{ord(char):04X}), which is not UTF-8"


def checked_text(text: str, what: str) -> str:
    """`text` unchanged, or `InvalidInput` naming `what` ("the reason", "filter 'task'")."""
    problem = text_problem(text)
    if problem is not None:
        raise InvalidInput(f"{what} {problem}, which no store keeps")
    return text


def row_id(text: str) -> int | None:
    """The row id `text` names: ASCII digits, at most MAX_ROW_ID; None for anything else."""
    if not _DIGITS.fullmatch(text) or len(text.lstrip("0")) > len(str(MAX_ROW_ID)):
        return None
    value = int(text)
    return value if value <= MAX_ROW_ID else None


def is_digits(text: str) -> bool:
    """Whether `text` is ASCII digits — an id's shape, however large."""
    return _DIGITS.fullmatch(text) is not None


def beyond_ids(text: str) -> str:
    """An id past MAX_ROW_ID, as a message names it."""
    return f"{text[:40]} (row ids stop at {MAX_ROW_ID})"


def storable_text(text: str) -> str:
    """`text` as both stores can keep it: a NUL written as ``\\0`` (PostgreSQL's text cannot
    hold one), a lone surrogate (bytes decoded with ``surrogateescape``, e.g. a file name) as its
    backslash escape (it is not Unicode, so neither UTF-8 nor JSON can carry it). An error message
    from a handler or a provider is whatever they raised: writing it must not fail the write
    that records the outcome."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
