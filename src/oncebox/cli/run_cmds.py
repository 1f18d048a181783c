"""`oncebox migrate`, `oncebox worker`, `oncebox enqueue`: set up, run, and put work in."""

from __future__ import annotations

import json
import math
import re
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from wsgiref.simple_server import WSGIServer

import click

from oncebox.box import DEFAULT_URL, Box
from oncebox.cli.common import (
    DEFAULT_FILE,
    app_option,
    backlog_lines,
    db_option,
    email_option,
    fail,
    json_option,
    load_app,
    print_json,
    reported,
    say,
    say_default_created,
)
from oncebox.jobs.codec import MAX_DEPTH
from oncebox.jobs.tasks import Task
from oncebox.kernel.clock import monotonic
from oncebox.kernel.errors import InvalidArguments
from oncebox.lanes.pruner import HISTORY_AHEAD
from oncebox.lanes.worker import WorkerConfig, WorkerStarted
from oncebox.store import open_store
from oncebox.store.protocol import Store
from oncebox.store.records import HISTORY_WAITING_CAP


@click.command()
@db_option
@click.option(
    "--move-history",
    is_flag=True,
    help="Then move the finished jobs of a deployment from before the history (migration 25, "
    "PostgreSQL) into it now, in batches, with progress (the workers' pruners do it otherwise, "
    "paced). Online; stop and rerun it at any point.",
)
def migrate(db: str | None, move_history: bool) -> None:
    """Apply the schema migrations this oncebox knows (safe to run repeatedly, and to run
    before new workers start). Without --db, to Box()'s default database, ./oncebox.db."""
    fresh = not db and not DEFAULT_FILE.exists()
    with reported():
        store = open_store(db or DEFAULT_URL, migrate=False)
        if fresh:
            say_default_created()
        try:
            applied = store.schema_migrate()
            status = store.schema_status()
            if applied:
                say(
                    f"applied migration(s) {', '.join(map(str, applied))}; "
                    f"schema is at version {status.current}"
                )
            else:
                say(f"schema is up to date (version {status.current})")
            _history(store, move=move_history)
        finally:
            store.close()


#: finished jobs moved per transaction by `migrate --move-history`
MOVE_BATCH = 5_000


def _history(store: Store, *, move: bool) -> None:
    """Say what waits to move into the history; with `move`, move it, saying how far it got
    every few seconds (each batch commits: a stop loses nothing)."""
    first = store.job_history_tend(HISTORY_AHEAD, MOVE_BATCH if move else 0)
    if not move:
        if first.waiting:
            say(
                f"finished jobs from before the history wait to move into it ({first.waiting}"
                f"{'+' if first.waiting >= HISTORY_WAITING_CAP else ''}): the workers' pruners "
                "move them in batches, or run `oncebox migrate --move-history` to move them now"
            )
        return
    moved, started, shown = first.moved, monotonic(), monotonic()
    while first.moved:
        first = store.job_history_tend(HISTORY_AHEAD, MOVE_BATCH)
        moved += first.moved
        if monotonic() - shown >= PROGRESS_EVERY_S:
            shown = monotonic()
            say(f"  moved {moved} finished jobs into the history ({rate(moved, started)}/s)")
    say(f"moved {moved} finished jobs into the history in {monotonic() - started:.1f} s")


PROGRESS_EVERY_S = 5.0


def rate(count: int, since: float) -> int:
    took = monotonic() - since
    return round(count / took) if took > 0 else count


@click.command()
@app_option
@db_option
@email_option
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Consumer threads.",
)
@click.option("--queues", metavar="Q1,Q2", help="Only these queues (default: every queue).")
@click.option("--until-idle", is_flag=True, help="Exit once nothing is due.")
@click.option(
    "--wait-up-to",
    "horizon",
    type=click.FloatRange(0, 86400),
    default=60,
    show_default=True,
    metavar="SECONDS",
    help="With --until-idle: keep working while this worker's work falls due within this "
    "many seconds (a retry, a channel's pause, a stranded lease).",
)
@click.option(
    "--simulated-time",
    is_flag=True,
    help="Run on a frozen or offset database clock that another process holds (a test "
    "harness driving time on purpose); without it such a clock is refused.",
)
@click.option(
    "--metrics-bind",
    metavar="HOST:PORT",
    help="Serve this worker's own figures (its store operations, leases lost) at /metrics; "
    "store-wide figures come from `oncebox metrics`.",
)
def worker(
    *,
    app: str | None,
    db: str | None,
    email: str | None,
    concurrency: int,
    queues: str | None,
    until_idle: bool,
    horizon: float,
    simulated_time: bool,
    metrics_bind: str | None,
) -> None:
    """Run a worker: consumers, outbox dispatcher, scheduler, sweepers, lease keeper, rescuer,
    resolver and pruner. SIGTERM or Ctrl-C stops it gracefully (a second one at once).

    With --until-idle it exits 0 once nothing remains; when work remains that falls due beyond
    --wait-up-to (or that no live worker serves), it says what and when, and exits 3."""
    with reported():
        box = load_app(app, db, email)
        names = tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None
        exporter = None if metrics_bind is None else process_exporter(box, metrics_bind)
        config = WorkerConfig(
            concurrency=concurrency,
            queues=names,
            until_idle=until_idle,
            simulated_time=simulated_time,
            idle_horizon=timedelta(seconds=horizon),
        )
        try:
            result = box.worker(config).run(on_start=lambda started: say(start_line(app, started)))
        finally:
            if exporter is not None:
                exporter.shutdown()
                exporter.server_close()
    say(str(result).splitlines()[0])
    if until_idle and not result.settled:
        assert result.now is not None
        say(f"remaining, by the database's clock ({result.now.isoformat(timespec='seconds')}):")
        for line in backlog_lines(result.remaining, result.unserved, result.now):
            say(f"  {line}")
        sys.exit(REMAINS)


def start_line(app: str | None, started: WorkerStarted) -> str:
    """A worker's first line: where it works, whose code, what it serves, how."""
    return " · ".join(
        [
            f"worker started: {started.where}",
            f"app {app}",
            f"tasks {_names(started.tasks)}",
            f"channels {_names(started.channels)}",
            f"concurrency {started.concurrency}",
            f"scheduler {'on' if started.scheduler else 'off'}",
        ]
    )


def _names(names: tuple[str, ...], shown: int = 8) -> str:
    if not names:
        return "none"
    more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def process_exporter(box: Box, bind: str) -> WSGIServer:
    """This worker's own figures at /metrics, served from a thread while it works."""
    from oncebox.cli.metrics_cmd import address, serve  # noqa: PLC0415 (prometheus_client)
    from oncebox.cli.prometheus import ProcessCollector  # noqa: PLC0415

    server = serve(bind, ProcessCollector(box.metrics))
    threading.Thread(target=server.serve_forever, name="oncebox-metrics", daemon=True).start()
    say(f"serving {address(server)} (this worker's own figures)")
    return server


REMAINS = 3  # worker --until-idle: work remains beyond the horizon (docs/cli.md, exit codes)
INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII: int() reads other scripts' digits too


def _finite(value: float | None) -> float | None:
    if value is not None and math.isnan(value):
        raise click.BadParameter("must be a number of seconds", param_hint="--delay")
    return value


def split_assignments(pairs: tuple[str, ...]) -> dict[str, str]:
    """`name=value` pairs, as text; each name once."""
    raw: dict[str, str] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier():
            raise click.BadParameter(
                f"{pair!r} is not name=value (e.g. customer_id=42)", param_hint="ARGS"
            )
        if name in raw:
            raise click.BadParameter(f"{name!r} is given twice", param_hint="ARGS")
        raw[name] = text
    return raw


NOT_JSON = object()  # what _json_value returns for text that is not JSON
_MAX_DIGITS = sys.get_int_max_str_digits() or 4300  # what int() reads (0: no limit set)


def _shown(text: str) -> str:
    """A value quoted in a one-line error: shortened, anything unprintable escaped."""
    return ascii(text if len(text) <= 40 else text[:40] + "…")


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose names are all different: `{"x": 1, "x": 2}` is refused rather than
    read as {"x": 2} (another reader of the same text may keep the first)."""
    value: dict[str, Any] = {}
    for name, item in pairs:
        if name in value:
            raise InvalidArguments(f"a JSON object names {_shown(name)} more than once")
        value[name] = item
    return value


def _json_value(text: str) -> Any:
    """`text` parsed as JSON; NOT_JSON when it is not JSON (it is then taken as text). JSON that
    cannot be taken faithfully is refused: duplicated names, nesting so deep the parser would
    overflow, an integer longer than Python reads."""
    try:
        return json.loads(text, object_pairs_hook=_unique_names)
    except json.JSONDecodeError:
        return NOT_JSON
    except RecursionError:
        raise InvalidArguments(f"the value is nested deeper than {MAX_DEPTH}") from None
    except ValueError:  # int() refuses a number longer than sys.get_int_max_str_digits()
        raise InvalidArguments(
            f"the value holds a number longer than {_MAX_DIGITS} digits, too long to read"
        ) from None


def typed_arguments(task: Task, raw: dict[str, str]) -> dict[str, Any]:
    """Values by the handler's annotations: an `int` parameter takes an integer (`01` is 1, so
    it renders the same key as 1), a `str` parameter the text as typed (`2026-W33`, `42`);
    anything else is parsed as JSON when it is valid JSON, else taken as text.

    Values the shell passed that are not UTF-8 (a lone surrogate), integers longer than Python
    reads, JSON with duplicated names or nested beyond what the parser can take are refused here
    with InvalidArguments (a usage error), never passed on to fail as something unexpected."""
    args: dict[str, Any] = {}
    for name, text in raw.items():
        where = f"argument {name!r} of task {task.name!r}"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start : exc.end]
            raise InvalidArguments(
                f"{where} is not UTF-8 text: {_shown(bad)} (a byte the shell could not decode; "
                "check the terminal's encoding)"
            ) from None
        parameter = task.signature.parameters.get(name)
        annotation = parameter.annotation if parameter is not None else None
        if annotation in (int, "int"):
            if not INTEGER.fullmatch(text.strip()):
                raise InvalidArguments(f"{where} is an int: {_shown(text)}")
            try:
                args[name] = int(text)
            except ValueError:  # longer than sys.get_int_max_str_digits()
                raise InvalidArguments(
                    f"{where} is an int longer than {_MAX_DIGITS} digits, too long to read"
                ) from None
        elif annotation in (str, "str"):
            args[name] = text
        else:
            try:
                value = _json_value(text)
            except InvalidArguments as exc:
                raise InvalidArguments(f"{where}: {exc}") from None
            args[name] = text if value is NOT_JSON else value
    return args


@click.command()
@click.argument("task")
@click.argument("pairs", metavar="NAME=VALUE...", nargs=-1)
@click.option(
    "--run-at",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]),
    help="Not before this instant (UTC unless an offset is given).",
)
@click.option(
    "--delay",
    type=click.FloatRange(0, 100 * 366 * 86400),
    callback=lambda _ctx, _param, value: _finite(value),
    help="Not before this many seconds.",
)
@app_option
@db_option
@json_option
def enqueue(
    *,
    task: str,
    pairs: tuple[str, ...],
    run_at: datetime | None,
    delay: float | None,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Enqueue one job of TASK with NAME=VALUE arguments (typed by the handler's annotations:
    see docs/cli.md). Enqueueing a key that is already claimed or active writes
    nothing and says which job holds it (exit 0: the operation is already in hand)."""
    raw = split_assignments(pairs)
    if run_at is not None and delay is not None:
        fail("give --run-at or --delay, not both", 2)
    with reported():
        box = load_app(app, db)
        if run_at is not None and run_at.tzinfo is None:
            run_at = run_at.replace(tzinfo=UTC)
        resolved = box.registry.resolve(task)
        result = box.enqueue_args(
            resolved,
            typed_arguments(resolved, raw),
            run_at=run_at,
            delay=None if delay is None else timedelta(seconds=delay),
        )
    if as_json:
        print_json(
            {
                "job_id": result.job_id,
                "key": result.key,
                "created": result.created,
                "state": result.state,
                "reason": result.reason,
            }
        )
    else:
        say(str(result))
