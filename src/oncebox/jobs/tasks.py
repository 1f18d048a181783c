"""Tasks: a handler, its stored name, its key template and its policies.

A task's *stored name* (explicit `name=`, else the function's name) is what jobs, the CLI and
intent rows refer to; renaming a task is therefore a data migration, not a refactor. Everything a
task promises is checked when it is declared: the key template parses and names only parameters
of the handler, the handler takes the job context first, the policies are in range.

A task declared without a key template is a plain at-least-once job: no intent row, no claim, and
a lost acknowledgement or redelivery runs it again. That is allowed and documented, not hidden.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from oncebox.jobs.debounce import Collapse, Debounce, Throttle, collapse_of
from oncebox.jobs.keys import KeyTemplate, quote_template
from oncebox.jobs.limits import TaskLimit, TaskLimits, plan_of, task_limits
from oncebox.jobs.retry import Retry
from oncebox.kernel.durations import check_keep
from oncebox.kernel.errors import (
    ConfigurationError,
    InvalidArguments,
    KeyTemplateError,
    UnknownTask,
)
from oncebox.store.params import LimitPlan

NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,100}")
DEFAULT_QUEUE = "default"
DEFAULT_TIMEOUT = timedelta(minutes=5)


def check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise ConfigurationError(
            f"{kind} name {value!r} must be 1-100 characters of letters, digits and _ . : -"
        )
    return value


@dataclass(frozen=True)
class Task:
    """A registered handler and its policies. Call it like the function to run it directly."""

    name: str
    fn: Callable[..., Any]
    key: KeyTemplate | None
    retry: Retry
    timeout: timedelta
    priority: int
    queue: str
    group_by: str | None
    keep_intents: timedelta | None
    signature: inspect.Signature
    keep_jobs: timedelta | None = None  # None: the box's Retention.jobs (retention/policy.py)
    limits: TaskLimits | None = None  # concurrency and rate limits (jobs/limits.py)
    collapse: Collapse | None = None  # a debounce or throttle (jobs/debounce.py)
    _shape: _Shape = field(init=False, repr=False, compare=False)

    def __call__(self, ctx: Any, /, **kwargs: Any) -> Any:
        return self.fn(ctx, **kwargs)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_shape", _Shape.of(self.signature))

    def check_args(self, args: Mapping[str, Any]) -> None:
        """Raise `InvalidArguments` if `args` do not fit the handler's signature, or a value
        does not have its parameter's scalar type (`int`, `str`, `float`, `bool`, or one of them
        `| None`): a message whose customer id is "abc" dies at once with its field named,
        instead of running with a value the handler never expected."""
        shape = self._shape
        if not shape.fits(args):
            try:
                self.signature.bind(**args)  # says what does not fit, in Python's words
            except TypeError as exc:
                raise InvalidArguments(f"arguments do not fit task {self.name!r}: {exc}") from None
        checks = shape.checks
        for name, value in args.items():
            expected = checks.get(name)
            if expected is not None and not expected(value):
                raise InvalidArguments(
                    f"argument {name!r} of task {self.name!r} must be "
                    f"{annotation_text(self.signature, name)}, not {type(value).__name__} "
                    f"{_preview(value)}"
                )

    def render_key(self, args: Mapping[str, Any]) -> str | None:
        return None if self.key is None else self.key.render(args)

    def limit_key_of(self, args: Mapping[str, Any]) -> str | None:
        """A limited job's partition ('' when its limits are not per partition); None for a
        task no limit holds."""
        return None if self.limits is None else self.limits.partition_of(self.name, args)

    def group_of(self, args: Mapping[str, Any]) -> str | None:
        if self.group_by is None:
            return None
        value = args.get(self.group_by)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise InvalidArguments(
                f"task {self.name!r} is ordered by {self.group_by!r}, which must be a str or int "
                f"argument, not {type(value).__name__}"
            )
        return str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_BASE_SCALARS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "str": lambda value: isinstance(value, str),
    "float": _is_float,
    "bool": lambda value: isinstance(value, bool),
}


def _or_none(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


_SCALARS: dict[str, Callable[[Any], bool]] = {
    **_BASE_SCALARS,
    **{f"{name} | None": _or_none(check) for name, check in _BASE_SCALARS.items()},
}


@dataclass(frozen=True)
class _Shape:
    """What `signature.bind(**args)` accepts, worked out once per task: the consumer checks
    every delivery against it, and `bind` costs more than the no-op handler it guards."""

    names: frozenset[str]  # parameters that can be passed by name
    required: frozenset[str]
    open: bool  # the handler takes **kwargs
    simple: bool  # no positional-only parameter (those always take the slow path)
    checks: dict[str, Callable[[Any], bool]]

    @classmethod
    def of(cls, signature: inspect.Signature) -> _Shape:
        kinds = inspect.Parameter
        by_name = [
            p
            for p in signature.parameters.values()
            if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        ]
        checks = {
            p.name: check
            for p in by_name
            if (check := _SCALARS.get(annotation_text(signature, p.name))) is not None
        }
        return cls(
            names=frozenset(p.name for p in by_name),
            required=frozenset(p.name for p in by_name if p.default is kinds.empty),
            open=any(p.kind is kinds.VAR_KEYWORD for p in signature.parameters.values()),
            simple=all(p.kind is not kinds.POSITIONAL_ONLY for p in signature.parameters.values()),
            checks=checks,
        )

    def fits(self, args: Mapping[str, Any]) -> bool:
        """True when `bind(**args)` would succeed; False when it might not (then ask it)."""
        if not isinstance(args, dict):
            return False
        given = args.keys()
        return self.simple and self.required <= given and (self.open or given <= self.names)


def annotation_text(signature: inspect.Signature, name: str) -> str:
    """The annotation as text, whether written under `from __future__ import annotations`
    (already text) or not; only the scalar forms above are checked, anything else is not."""
    parameter = signature.parameters.get(name)
    if parameter is None or parameter.annotation is inspect.Parameter.empty:
        return ""
    annotation = parameter.annotation
    if isinstance(annotation, str):
        if annotation.startswith("Optional[") and annotation.endswith("]"):
            return annotation[len("Optional[") : -1] + " | None"
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("NoneType", "None")


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def make_task(
    fn: Callable[..., Any],
    *,
    name: str | None,
    key: str | None,
    retry: Retry | None,
    timeout: float | timedelta,
    priority: int,
    queue: str,
    group_by: str | None,
    keep_intents: timedelta | None,
    keep_jobs: timedelta | None = None,
    limits: Sequence[TaskLimit] | None = None,
    partition: str | None = None,
    debounce: Debounce | None = None,
    throttle: Throttle | None = None,
) -> Task:
    """Build and check a task; every mistake is a `ConfigurationError` naming the task."""
    stored = check_name("task", name if name is not None else getattr(fn, "__name__", ""))
    check_name("queue", queue)
    if not callable(fn):
        raise ConfigurationError(f"task {stored!r}: the handler is not callable")
    full = inspect.signature(fn)
    params = list(full.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ConfigurationError(
            f"task {stored!r}: the handler must take the job context as its first positional "
            "parameter, e.g. def handler(ctx, customer_id: int)"
        )
    signature = full.replace(parameters=params[1:])
    accepts_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params[1:])
    names = {p.name for p in params[1:]}
    template = None
    if key is not None:
        try:
            template = KeyTemplate.parse(key)
        except KeyTemplateError as exc:
            raise KeyTemplateError(f"task {stored!r}: {exc}") from None
        missing = [f for f in template.fields if f not in names and not accepts_kwargs]
        if missing:
            raise KeyTemplateError(
                f"task {stored!r}: key template {quote_template(key)} uses "
                f"{', '.join(missing)}, which the handler does not take as parameters"
            )
    if group_by is not None and group_by not in names:
        raise ConfigurationError(f"task {stored!r}: group_by={group_by!r} is not a parameter")
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not seconds > 0:
        raise ConfigurationError(f"task {stored!r}: timeout must be positive, not {timeout!r}")
    if not isinstance(priority, int) or not -1000 <= priority <= 1000:
        raise ConfigurationError(f"task {stored!r}: priority must be an int in -1000..1000")
    if keep_intents is not None and (key is None or keep_intents <= timedelta(0)):
        raise ConfigurationError(
            f"task {stored!r}: keep_intents needs a key template and a positive duration"
        )
    check_keep(f"task {stored!r}", "keep_jobs", keep_jobs)
    parameters = names if not accepts_kwargs else None
    declared = task_limits(stored, limits, partition, parameters)
    collapse = collapse_of(stored, debounce, throttle, parameters)
    return Task(
        name=stored,
        fn=fn,
        key=template,
        retry=retry or Retry(),
        timeout=timedelta(seconds=seconds),
        priority=priority,
        queue=queue,
        group_by=group_by,
        keep_intents=keep_intents,
        signature=signature,
        keep_jobs=keep_jobs,
        limits=declared,
        collapse=collapse,
    )


def _template_text(template: KeyTemplate | None) -> str:
    return "no key" if template is None else quote_template(template.source)


class Registry:
    """The tasks one box knows, by stored name."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._plan: LimitPlan | None = None

    def add(self, task: Task) -> None:
        existing = self._tasks.get(task.name)
        if existing is not None and existing.fn is not task.fn:
            raise ConfigurationError(
                f"two tasks are named {task.name!r} ({existing.fn.__module__}."
                f"{existing.fn.__qualname__} and {task.fn.__module__}.{task.fn.__qualname__}); "
                "give one an explicit name="
            )
        if existing is not None and existing.key != task.key:
            raise ConfigurationError(
                f"task {task.name!r} is declared twice with different key templates "
                f"({_template_text(existing.key)} and {_template_text(task.key)})"
            )
        previous = self._tasks.get(task.name)
        self._tasks[task.name] = task
        try:  # a limit shared by name must be the same on every task that names it
            self._plan = plan_of(
                {t.name: t.limits for t in self._tasks.values() if t.limits is not None}
            )
        except ConfigurationError:
            if previous is None:
                del self._tasks[task.name]
            else:
                self._tasks[task.name] = previous
            raise

    def limit_plan(self) -> LimitPlan:
        """The limits of every limited task, as the lease applies them."""
        return self._plan or LimitPlan({}, {})

    def get(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTask(f"no task named {name!r} is registered (known: {known})") from None

    def resolve(self, task: Task | str | Callable[..., Any]) -> Task:
        if isinstance(task, Task):
            return self.get(task.name)
        if isinstance(task, str):
            return self.get(task)
        for candidate in self._tasks.values():
            if candidate.fn is task:
                return candidate
        raise UnknownTask(f"{getattr(task, '__qualname__', task)!r} is not a registered task")

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def all(self) -> list[Task]:
        return [self._tasks[name] for name in sorted(self._tasks)]
