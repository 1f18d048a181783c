"""`oncebox …`: the command line.

Every command reads `ONCEBOX_DB` and `ONCEBOX_APP` and accepts `--db` and `--app`. User mistakes
(a bad URL, an unknown key, a missing `--reason`) print one line on stderr and exit 2; runtime
failures (database unreachable, schema too old) print one line and exit 1. No traceback for
either, and nothing is written when a command fails.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, NoReturn, TypeVar

import click

from oncebox.box import Box
from oncebox.errors import (
    ConfigurationError,
    EnqueueError,
    InvalidState,
    NotFound,
    OnceboxError,
)
from oncebox.store import open_store
from oncebox.worker import WorkerConfig

F = TypeVar("F", bound=Callable[..., Any])
USAGE_ERRORS = (ConfigurationError, EnqueueError, NotFound, InvalidState)


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"oncebox: {message}", err=True)
    sys.exit(code)


@contextmanager
def reported() -> Iterator[None]:
    """Turn oncebox errors into one line and an exit code: 2 for user mistakes, 1 otherwise."""
    try:
        yield
    except USAGE_ERRORS as exc:
        fail(str(exc), 2)
    except OnceboxError as exc:
        fail(str(exc), 1)


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


def load_app(app: str | None, db: str | None) -> Box:
    """Import the user's module and return its Box. `--app` is required: a production worker
    never falls back to an example app."""
    if not app:
        fail("--app MODULE is required (or set ONCEBOX_APP): the module that holds your Box", 2)
    if db:
        os.environ["ONCEBOX_DB"] = db
    module_name, _, attr = app.partition(":")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            fail(f"cannot import app module {module_name!r}: {exc}", 2)
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
    if db and box.store.url != db:
        fail(
            f"--db {db} differs from the database of {app} ({box.where}); create the Box "
            "with Box() so it reads ONCEBOX_DB",
            2,
        )
    return box


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """oncebox: background jobs whose side effects happen once per business operation."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@db_option
def migrate(db: str | None) -> None:
    """Apply the schema migrations this oncebox knows (safe to run repeatedly)."""
    if not db:
        fail("--db URL is required (or set ONCEBOX_DB)", 2)
    with reported():
        store = open_store(db, migrate=False)
        try:
            applied = store.schema_migrate()
            status = store.schema_status()
        finally:
            store.close()
    if applied:
        click.echo(
            f"applied migration(s) {', '.join(map(str, applied))}; "
            f"schema is at version {status.current}"
        )
    else:
        click.echo(f"schema is up to date (version {status.current})")


@main.command()
@app_option
@db_option
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Consumer threads.",
)
@click.option("--queues", metavar="Q1,Q2", help="Only these queues (default: every queue).")
@click.option("--until-idle", is_flag=True, help="Exit once no job is due.")
def worker(
    app: str | None, db: str | None, concurrency: int, queues: str | None, until_idle: bool
) -> None:
    """Run a worker: consumers, lease keeper, rescuer, pruner. SIGTERM stops it gracefully."""
    with reported():
        box = load_app(app, db)
        names = tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None
        result = box.work(
            config=WorkerConfig(concurrency=concurrency, queues=names, until_idle=until_idle)
        )
    consumed = result.consumed
    click.echo(
        f"worker stopped: {consumed.completed} completed, {consumed.duplicates} duplicate(s) "
        f"absorbed, {consumed.retried} retried, {consumed.dead} dead"
    )


@main.group()
def dlq() -> None:
    """Dead letters: jobs that failed for good, kept with their key and every attempt."""


@dlq.command("replay")
@click.argument("key_or_id")
@click.option("--reason", required=True, help="Why; written to the audit log.")
@click.option("--actor", default=lambda: os.environ.get("USER", "cli"), show_default="$USER")
@app_option
@db_option
def dlq_replay(key_or_id: str, reason: str, actor: str, app: str | None, db: str | None) -> None:
    """Replay a dead job in place: same id, same key, history kept, audited."""
    with reported():
        box = _box_for_admin(app, db)
        outcome = box.replay(key_or_id, reason=reason, actor=actor)
    click.echo(f"job {outcome.id} ({outcome.key}) is ready again; audit #{outcome.audit_id}")


@main.group()
def jobs() -> None:
    """Inspect jobs."""


@jobs.command("show")
@click.argument("key_or_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@app_option
@db_option
def jobs_show(key_or_id: str, as_json: bool, app: str | None, db: str | None) -> None:
    """A job (by id) or a key's jobs, with every recorded attempt."""
    with reported():
        box = _box_for_admin(app, db)
        found = box.find(key_or_id)
        if not found:
            raise NotFound(f"no job with id or key {key_or_id!r}")
        records = [
            {**asdict(job), "attempts": [asdict(a) for a in box.store.job_attempt_list(job.id)]}
            for job in found
        ]
    if as_json:
        click.echo(json.dumps(records, default=str, indent=2))
        return
    for record in records:
        click.echo(
            f"job {record['id']}  {record['task']}  key={record['key']}  "
            f"state={record['state']}  outcome={record['outcome']}  "
            f"attempt={record['attempt']}"
        )
        for attempt in record["attempts"]:
            first = (attempt["error"] or "").splitlines()[:1]
            click.echo(
                f"  attempt {attempt['attempt']}: {attempt['outcome']} by "
                f"{attempt['worker']} at {attempt['finished_at']}: {' '.join(first)}"
            )


def _box_for_admin(app: str | None, db: str | None) -> Box:
    """Admin commands need only the database; the app is loaded when given (for its tasks)."""
    if app:
        return load_app(app, db)
    if not db:
        fail("--db URL (or --app MODULE) is required", 2)
    return Box(db)


def _check_week(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    from oncebox.periods import iso_week  # noqa: PLC0415 (keeps start-up light)

    if value is not None:
        try:
            iso_week.check(value)
        except OnceboxError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@main.command()
@click.option(
    "--db",
    metavar="URL",
    default="sqlite:///oncebox-demo.db",
    show_default=True,
    help="Database for the demo (reset first when it is the default file).",
)
@click.option(
    "--customers",
    type=click.IntRange(3, 1_000_000),
    default=300,
    show_default=True,
    help="How many freight customers to seed.",
)
@click.option(
    "--period",
    metavar="YYYY-Www",
    callback=_check_week,
    help="The ISO week to send (default: the current one).",
)
@click.option(
    "--email",
    envvar="ONCEBOX_EMAIL",
    metavar="URL",
    help="Send through this provider (smtp://…, resend://…) instead of the file sink "
    "[env ONCEBOX_EMAIL].",
)
@click.option("--no-faults", is_flag=True, help="Run without injected faults.")
def demo(db: str, customers: int, period: str | None, email: str | None, no_faults: bool) -> None:
    """Run the logistics weekly digest end to end under injected faults, then check that every
    eligible customer has one digest and nothing was sent twice."""
    from oncebox.examples.logistics import demo as logistics  # noqa: PLC0415

    options = logistics.DemoOptions(
        db=db, customers=customers, period=period, email=email, faults=not no_faults
    )
    with reported():
        code = logistics.main(options)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
