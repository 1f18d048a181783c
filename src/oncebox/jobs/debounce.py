"""Debounce and throttle: enqueues of one task within a window collapse into one pending job.

    @box.task(debounce=oncebox.Debounce(timedelta(seconds=30), by="{customer_id}",
                                        max_wait=timedelta(minutes=5)))
    def refresh_preview(ctx, customer_id: int, edit: int): ...

- `Debounce(window)`: run once, `window` after the last enqueue of a burst. An enqueue while a
  job of the same debounce key is still pending (ready, not yet leased) pushes its run time to
  `window` from now — never past `max_wait` after the burst's first enqueue, so a stream of
  edits cannot postpone it for ever.
- `Throttle(window)`: runs scheduled at least a window apart. The first enqueue runs at once;
  one arriving while a job of its debounce key is pending joins it; one arriving after that job
  was leased is scheduled `window` after the run time of the job before it (a run that started
  late can come closer to the next).
- `by`: which enqueues collapse together, a template over the arguments like a key's (the
  task's own name when omitted: every enqueue of the task).
- `keep`: whose arguments the pending job runs with — the "last" enqueue's (default: the newest
  state) or the "first" one's.

A job that was leased is no longer pending: the next enqueue starts a new one, so work that
arrives while a run is in progress is never lost to it. This is not a key's dedupe: a key says
"this operation happened, never again"; a debounce says "these requests are one run". A keyed
task may be debounced too — with `keep="last"` the pending job takes the newest enqueue's key,
unless that key is already taken, and then the enqueue is a duplicate as always.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from oncebox.jobs.keys import KeyTemplate, argument_template
from oncebox.kernel.errors import ConfigurationError, InvalidKey

Keep = Literal["last", "first"]
MAX_WINDOW = timedelta(days=31)


@dataclass(frozen=True)
class Debounce:
    """Run once, `window` after the last enqueue of a burst (at most `max_wait` after its
    first)."""

    window: timedelta
    by: str | None = None
    keep: Keep = "last"
    max_wait: timedelta | None = None


@dataclass(frozen=True)
class Throttle:
    """Runs scheduled at least `window` apart; enqueues in between join the pending job."""

    window: timedelta
    by: str | None = None
    keep: Keep = "last"


@dataclass(frozen=True)
class Collapse:
    """A task's debounce or throttle, checked: what `enqueue` applies."""

    mode: Literal["debounce", "throttle"]
    window: timedelta
    max_wait: timedelta | None
    keep_last: bool
    by: KeyTemplate | None

    def key_of(self, task: str, args: Mapping[str, Any]) -> str:
        """The debounce key: the task's name, and the rendered `by` when there is one."""
        if self.by is None:
            return task
        try:
            return f"{task}/{self.by.render(args)}"
        except InvalidKey as exc:
            raise InvalidKey(f"task {task!r}: {self.mode} by: {exc}") from None


def collapse_of(
    task: str, debounce: Debounce | None, throttle: Throttle | None, parameters: set[str] | None
) -> Collapse | None:
    """Check a task's `debounce=` / `throttle=`; every mistake is a `ConfigurationError`."""
    where = f"task {task!r}"
    if debounce is not None and throttle is not None:
        raise ConfigurationError(f"{where}: give debounce= or throttle=, not both")
    declared = debounce or throttle
    if declared is None:
        return None
    mode: Literal["debounce", "throttle"] = "debounce" if debounce is not None else "throttle"
    if not isinstance(declared, (Debounce, Throttle)) or (
        (mode == "debounce") != isinstance(declared, Debounce)
    ):
        kind = "Debounce" if mode == "debounce" else "Throttle"
        raise ConfigurationError(f"{where}: {mode}= takes oncebox.{kind}(window), not {declared!r}")
    _check_span(where, f"the {mode} window", declared.window)
    max_wait = declared.max_wait if isinstance(declared, Debounce) else None
    if max_wait is not None:
        _check_span(where, "max_wait", max_wait)
        if max_wait < declared.window:
            raise ConfigurationError(f"{where}: max_wait must be at least the debounce window")
    if declared.keep not in ("last", "first"):
        raise ConfigurationError(f"{where}: keep= is 'last' or 'first', not {declared.keep!r}")
    template = None
    if declared.by is not None:
        template = argument_template(where, f"{mode} by", declared.by, parameters)
    return Collapse(mode, declared.window, max_wait, declared.keep == "last", template)


def _check_span(where: str, what: str, value: object) -> None:
    if not isinstance(value, timedelta) or not timedelta(0) < value <= MAX_WINDOW:
        raise ConfigurationError(
            f"{where}: {what} must be a timedelta within 0..{MAX_WINDOW.days} days, not {value!r}"
        )
