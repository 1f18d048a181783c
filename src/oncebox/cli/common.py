"""What every command shares: options, loading the user's Box, errors as one line and an exit
code, and printing data as text or `--json`.

Exit codes: 0 done; 2 a usage mistake (bad option, bad URL, unknown key or name, missing
`--reason`, an action that does not apply to the row's state); 1 a runtime failure (database
unreachable, schema too old) or, for `keys check` and `demo`, a check that found a problem. One
line on stderr, never a traceback, and nothing written when a command fails.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from oncebox.box import DEFAULT_NOTICE, DEFAULT_URL, Box
from oncebox.kernel.errors import (
    ConfigurationError,
    EnqueueError,
    InvalidState,
    NotFound,
    OnceboxError,
)
from oncebox.kernel.inert import printable, redact
from oncebox.kernel.storable import MAX_ROW_ID, beyond_ids, is_digits, row_id
from oncebox.store import open_store
from oncebox.store.migrations import check_runnable
from oncebox.store.records import BacklogRow

F = TypeVar("F", bound=Callable[..., Any])
USAGE_ERRORS = (ConfigurationError, EnqueueError, NotFound, InvalidState)


def say(text: str = "", *, err: bool = False) -> None:
    """Print `text` for a person, every line of it inert (`oncebox.kernel.inert.printable`): what
    users and providers wrote cannot drive the terminal. Only `--json` output bypasses this; JSON
    escapes every control itself."""
    click.echo("\n".join(printable(line) for line in text.split("\n")), err=err)


class InertFormatter(logging.Formatter):
    """The worker's log as `say` prints: a handler's error or a provider's reply in a log line
    cannot drive the terminal (or the log viewer) either."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(printable(line) for line in super().format(record).split("\n"))


def fail(message: str, code: int) -> NoReturn:
    say(f"oncebox: {message}", err=True)
    sys.exit(code)


@contextmanager
def reported() -> Iterator[None]:
    """Turn oncebox errors into one line and an exit code: 2 for user mistakes, 1 otherwise.
    Anything else (a bug, a driver error) is one line and exit 1 too; `-v` shows its traceback."""
    try:
        yield
    except USAGE_ERRORS as exc:
        fail(str(exc), 2)
    except OnceboxError as exc:
        fail(str(exc), 1)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        if logging.getLogger().isEnabledFor(logging.INFO):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        fail(f"unexpected {type(exc).__name__}: {first} (run with -v for the traceback)", 1)


# -- options --------------------------------------------------------------------------------------


def db_option(func: F) -> F:
    return click.option(
        "--db",
        envvar="ONCEBOX_DB",
        metavar="URL",
        help="Database URL: sqlite:///file.db or postgresql://host/db [env ONCEBOX_DB].",
    )(func)


def app_option(func: F) -> F:
    return click.option(
        "--app",
        envvar="ONCEBOX_APP",
        metavar="MODULE[:ATTR]",
        help="Module holding your Box (attribute `box` unless named) [env ONCEBOX_APP].",
    )(func)


def email_option(func: F) -> F:
    return click.option(
        "--email",
        envvar="ONCEBOX_EMAIL",
        metavar="URL",
        help="Email provider for channels declared without one: smtp://…, resend://…, "
        "file://dir [env ONCEBOX_EMAIL].",
    )(func)


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (shapes in docs/cli.md)."
    )(func)


def reason_option(func: F) -> F:
    return click.option("--reason", required=True, help="Why; written to the audit log.")(func)


def actor_option(func: F) -> F:
    return click.option(
        "--actor",
        default=lambda: os.environ.get("USER", "cli"),
        show_default="$USER",
        help="Who; written to the audit log.",
    )(func)


def before_option(func: F) -> F:
    return click.option(
        "--before",
        "before_id",
        type=click.IntRange(0, MAX_ROW_ID),
        help="Only ids below this (paging).",
    )(func)


def limit_option(default: int = 50) -> Callable[[F], F]:
    def wrap(func: F) -> F:
        return click.option(
            "--limit",
            type=click.IntRange(1, 100_000),
            default=default,
            show_default=True,
            help="At most this many rows.",
        )(func)

    return wrap


# -- the user's box -------------------------------------------------------------------------------


def load_app(app: str | None, db: str | None, email: str | None = None) -> Box:
    """Import the user's module and return its Box. A production command never falls back to
    an example app: without `--app` this is a usage error. Without `--db` the module's Box
    chooses (`Box()`: ./oncebox.db); the library's notice of that default is said once, in the
    command's words, by the command that creates the file (`say_default_created`)."""
    if not app:
        fail("--app MODULE is required (or set ONCEBOX_APP): the module that holds your Box", 2)
    if db:
        os.environ["ONCEBOX_DB"] = db
    if email:
        os.environ["ONCEBOX_EMAIL"] = email
    module_name, _, attr = app.partition(":")
    sys.path.insert(0, os.getcwd())
    fresh = not DEFAULT_FILE.exists()
    with _default_notice_held() as held:
        box = _find_box(app, module_name, attr)
    if held and fresh and DEFAULT_FILE.exists():
        say_default_created()
    if db and box.store.url != db:
        fail(
            f"--db {redact(db)} differs from the database of {app} ({box.where}); create the "
            "Box with Box() so it reads ONCEBOX_DB",
            2,
        )
    return box


def _find_box(app: str, module_name: str, attr: str) -> Box:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            parent, _, child = module_name.rpartition(".")
            hint = (
                f" (an attribute is named after a colon: {parent}:{child})"
                if "is not a package" in str(exc)
                else ""
            )
            fail(f"cannot import app module {module_name!r}: {exc}{hint}", 2)
        raise
    candidates = (
        [getattr(module, attr, None)]
        if attr
        else [getattr(module, "box", None)]
        + [v for v in vars(module).values() if isinstance(v, Box)]
    )
    box = next((c for c in candidates if isinstance(c, Box)), None)
    if box is None:
        fail(f"{app} holds no oncebox.Box (expected an attribute named {attr or 'box'!r})", 2)
    return box


DEFAULT_FILE = Path(DEFAULT_URL.removeprefix("sqlite:///"))  # relative: in the current folder


def say_default_created() -> None:
    """The library's notice (`box.DEFAULT_NOTICE`) as the command line says it: once, when a
    command creates the default database, on one line without a log prefix."""
    say(
        f"no database given (--db or ONCEBOX_DB): using {DEFAULT_URL}, a SQLite file in "
        f"{os.getcwd()}",
        err=True,
    )


@contextmanager
def _default_notice_held() -> Iterator[list[logging.LogRecord]]:
    """While the user's module builds its Box, hold back the library's notice that it fell back
    to the default database: the caller says it once, if this command created the file — not as
    a timestamped warning on every command."""
    held: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.msg == DEFAULT_NOTICE:
            held.append(record)
            return False
        return True

    logger = logging.getLogger("oncebox")
    logger.addFilter(keep)
    try:
        yield held
    finally:
        logger.removeFilter(keep)


def is_id(key_or_id: str) -> bool:
    """Whether a KEY_OR_ID argument is a row id: ASCII digits only. `str.isdigit()` is true of
    superscripts and other scripts' digits too, which `int()` refuses or reads as a number."""
    return is_digits(key_or_id)


def id_or_key(key_or_id: str, what: str) -> str:
    """A KEY_OR_ID argument, refused as NotFound when it is digits but not ASCII ones ('²',
    '٤٢'): no row has such an id (ids are ASCII digits) nor such a key (keys are ASCII), and
    the operations that take it would read it as an id; or ASCII digits past any row id."""
    if key_or_id.isdigit() and not is_id(key_or_id):
        raise NotFound(f"no {what} with id or key {key_or_id!r}")
    if is_id(key_or_id) and row_id(key_or_id) is None:
        raise NotFound(f"no {what} with id {beyond_ids(key_or_id)}")
    return key_or_id


def box_for_admin(app: str | None, db: str | None) -> Box:
    """Inspection and operator commands need only the database; the app is loaded when given
    (for its tasks, channels and schedules). Without either, the database is `Box()`'s default,
    ./oncebox.db — read as it is: a file that does not exist is an error, never created."""
    if app:
        box = load_app(app, db)
        check_runnable(box.store.schema_status(), box.where)
        return box
    try:
        store = open_store(db or DEFAULT_URL, migrate=False, must_exist=True)
    except NotFound as exc:
        if db:
            raise
        raise NotFound(
            f"{exc} (no --db or ONCEBOX_DB given: the default is {DEFAULT_URL}, as for Box())"
        ) from None
    box = Box(store=store)
    check_runnable(box.store.schema_status(), box.where)
    return box


# -- output ---------------------------------------------------------------------------------------


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    empty: str,
    uncut: Collection[str] = (),
) -> None:
    """Aligned columns; long cells are cut so a row stays on one line, except in the columns
    named in `uncut` (a key an operator must read whole)."""
    if not rows:
        say(empty)
        return
    whole = [header in uncut for header in headers]
    cells = [[_cell(value, keep) for value, keep in zip(row, whole, strict=True)] for row in rows]
    widths = [max(len(header), *(len(row[i]) for row in cells)) for i, header in enumerate(headers)]
    say("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for row in cells:
        say("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _cell(value: Any, whole: bool = False) -> str:
    text = "-" if value is None else str(value)
    text = printable(text.splitlines()[0] if text.strip() else text)
    return text if len(text) <= 60 or whole else text[:59] + "…"


def age(since: datetime | None, now: datetime) -> str:
    """A duration for people: 45s, 12m, 3h, 2d."""
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def owner_state(fan_out: Mapping[str, Any], now: datetime) -> str:
    """A running fan-out's owner (`shapes.fan_out`): alive or gone, its last renewal, and when
    its lease ends or ended."""
    renewed = fan_out["renewed_at"] and datetime.fromisoformat(fan_out["renewed_at"])
    if renewed is None:
        owner = (
            "alive (judged by its lease)" if fan_out["owner_live"] else "gone (its lease ran out)"
        )
    elif fan_out["owner_live"]:
        owner = f"alive (renewed {age(renewed, now)} ago)"
    else:
        owner = f"gone (last renewed {age(renewed, now)} ago)"
    ends = datetime.fromisoformat(fan_out["lease_ends_at"])
    if ends >= now:
        return f"{owner}; its lease ends {fan_out['lease_ends_at']} (in {age(now, ends)})"
    return f"{owner}; its lease ended {fan_out['lease_ends_at']} ({age(ends, now)} ago)"


def fan_out_line(fan_out: Mapping[str, Any], now: datetime) -> str:
    """A running fan-out for `status`: whose, whether it is alive, and what to do if not."""
    head = (
        f"{fan_out['schedule']} {fan_out['period']}: owner {fan_out['owner']} "
        f"{owner_state(fan_out, now)}"
    )
    rerun = f"oncebox schedule run {fan_out['schedule']} --period {fan_out['period']}"
    if datetime.fromisoformat(fan_out["lease_ends_at"]) < now:
        return f"{head}; the next scheduler tick or trigger resumes it, or now: {rerun}"
    if not fan_out["owner_live"]:
        return f"{head}; take it over now: {rerun} --take-over --reason ..."
    return head


def backlog_lines(rows: Sequence[BacklogRow], unserved: Sequence[str], now: datetime) -> list[str]:
    """Work not finished, one line per task or channel: how much, and when it can next move —
    or that nothing will move it (a task no live worker serves)."""

    def when(at: datetime | None) -> str:
        if at is None:
            return "-"
        shown = at.isoformat(timespec="seconds")
        if at <= now:
            return f"{shown} (due now)"
        return f"{shown} (in {age(now, at)})"

    lines = []
    for row in rows:
        noun = "job(s) of task" if row.kind == "job" else "message(s) on channel"
        parts = []
        if row.waiting:
            verb = "ready" if row.kind == "job" else "pending"
            parts.append(f"{row.waiting} {verb}, next due {when(row.next_due_at)}")
        if row.held:
            parts.append(f"{row.held} leased until {when(row.held_until)}")
        if row.kind == "job" and row.name in unserved:
            parts.append("no live worker serves this task")
        lines.append(f"{noun} {printable(row.name)}: " + "; ".join(parts))
    return lines
