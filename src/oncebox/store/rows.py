"""Result rows read by column name.

A statement's column names — its aliases — are the field names of the record it fills
(`RETURNING args AS args_json` fills `LeasedJob.args_json`), so no code counts columns and a
reordered SELECT cannot shift a value into the wrong field. The names are asked of the driver
once per statement text and the match is kept: a row then costs one `itemgetter` call, the
conversion of its instant and flag fields and the constructor — no dict per row, no look at the
cursor's description per result set.

Conversions follow the record's field types: an instant (`datetime`, `datetime | None`) goes
through the store's decoder (microseconds on SQLite, timestamptz on PostgreSQL), memoised per
result set (a leased batch shares its lease time, often its run time too); a flag (`bool`)
through `bool` (SQLite keeps 0 and 1). Columns no field is named after are left to the caller
(`columns` gives their positions).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import Any, TypeVar

R = TypeVar("R")
Names = tuple[str, ...]
Decode = Callable[[Any], datetime | None]


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    order: Callable[[Sequence[Any]], Sequence[Any]]  # a row's values in field order
    instants: tuple[int, ...]  # positions, in field order, to decode as instants
    flags: tuple[int, ...]  # positions to make bools


_columns: dict[str, dict[str, int]] = {}
_plans: dict[tuple[type, str, Names], _Plan] = {}


class Result:
    """The rows of one statement, and how to learn its column names (asked once per statement
    text, whatever the schema name or a test switch made of it); `count` is the driver's row
    count (the rows an UPDATE changed)."""

    __slots__ = ("_describe", "count", "rows", "statement")

    def __init__(
        self,
        statement: str,
        rows: list[Any],
        describe: Callable[[], Sequence[str]],
        count: int = -1,
    ) -> None:
        self.statement = statement
        self.rows = rows
        self._describe = describe
        self.count = count

    def columns(self) -> dict[str, int]:
        """Column name → position."""
        found = _columns.get(self.statement)
        if found is None:  # built whole before it is shared: other threads read it meanwhile
            found = {}
            for position, name in enumerate(self._describe()):
                found.setdefault(name, position)
            _columns[self.statement] = found
        return found

    def records(
        self, cls: type[R], decode: Decode, fixed: Mapping[str, Any] | None = None
    ) -> list[R]:
        """The rows as `cls` records; `fixed` gives the fields the statement does not return
        one value for every row (a lease's token)."""
        rows = self.rows
        if not rows:
            return []
        extra = tuple(fixed) if fixed else ()
        plan = _plans.get((cls, self.statement, extra))
        if plan is None:
            plan = _plans[(cls, self.statement, extra)] = _plan(cls, self.columns(), extra)
        if fixed:
            tail = tuple(fixed.values())
            rows = [row + tail for row in rows]
        seen: dict[Any, datetime | None] = {}  # each instant decoded once per result set
        order, instants, flags = plan.order, plan.instants, plan.flags
        built: list[R] = []
        for row in rows:
            values = list(order(row))
            for i in instants:
                value = values[i]
                try:
                    values[i] = seen[value]
                except KeyError:
                    values[i] = seen[value] = decode(value)
            for i in flags:
                values[i] = bool(values[i])
            built.append(cls(*values))
        return built

    def first(self, column: str) -> Any:
        """The value of `column` in the first row; None when there is no row."""
        return self.rows[0][self.columns()[column]] if self.rows else None

    def record(self, cls: type[R], decode: Decode) -> R | None:
        """The first row as a `cls` record; None when there is none."""
        if not self.rows:
            return None
        return Result(self.statement, self.rows[:1], self._describe).records(cls, decode)[0]


def _plan(cls: type, columns: dict[str, int], extra: Names) -> _Plan:
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    index = dict(columns)
    width = max(columns.values(), default=-1) + 1
    for offset, name in enumerate(extra):
        index[name] = width + offset
    wanted: list[int] = []
    for field in fields:
        if field.name in index:
            wanted.append(index[field.name])
            continue
        # a field the statement does not return must be trailing, with a default
        later = fields[len(wanted) :]
        if any(f.name in index for f in later) or any(
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            for f in later
        ):
            raise TypeError(
                f"{cls.__name__}.{field.name} is not among the statement's columns "
                f"{sorted(index)}: alias the column as the field is named"
            )
        break
    present = fields[: len(wanted)]
    order: Callable[[Sequence[Any]], Sequence[Any]]
    if len(wanted) == 1:
        only = wanted[0]
        order = lambda row: (row[only],)  # noqa: E731 (an itemgetter of one index gives no tuple)
    else:
        order = itemgetter(*wanted)
    return _Plan(
        order,
        tuple(i for i, f in enumerate(present) if _is_instant(hints[f.name])),
        tuple(i for i, f in enumerate(present) if hints[f.name] is bool),
    )


def _is_instant(hint: Any) -> bool:
    if hint is datetime:
        return True
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and datetime in (
        typing.get_args(hint)
    )
