"""Workload 7: how many statements an idle worker sends, across all its lanes (PostgreSQL).

    .venv/bin/python bench/idle.py [--seconds 30] [--warmup 5] [--ready-timeout 120]
                                   [--postgres URL] [--pg-bin DIR] [--json PATH]

A worker process (consumer, dispatcher, scheduler, sweeper, rescuer, pruner lanes; one task,
one schedule, one sweeper, one channel) runs on a fresh database with nothing to do. The target
is at most 1 statement per second counted by the server (LISTEN/NOTIFY wakes the lanes; polls
are the fallback), so the database lives on a private PostgreSQL cluster started for the
measurement in a temporary directory (`--pg-bin`'s initdb and pg_ctl, a free port on 127.0.0.1,
trust auth; as the `postgres` user when run as root, since initdb refuses root), with
`pg_stat_statements` preloaded, tracking every statement (`track = all`, `track_utility = on`,
so BEGIN, COMMIT, LISTEN and SET count). The worker runs in a process of its own (this script
with `--worker`); the warm-up starts once it has printed its start line — the one `oncebox
worker` prints, from `Worker.run(on_start=…)` — however long it takes to import (up to
`--ready-timeout`; a worker that exits first or stays silent fails the run, its output shown).
After the warm-up the counters are reset; at the end of the window, three counts:
- the headline, the server's: `calls` in pg_stat_statements of the top-level statements run in
  the worker's database (the measuring connection uses another database, so it is not counted),
  with the statements and how often each ran; statements run inside functions are reported apart
  (nested, not sent by the worker);
- the worker's own: every transaction it starts — an autocommit statement, or a transaction
  block however many statements it holds (pipelined or not) — recorded by wrapping psycopg in the
  worker process, with the statement that began it;
- `pg_stat_database.xact_commit + xact_rollback` for the database, a cross-check only: backends
  report their counters lazily (an idle one at most every 10 s), so a short window can catch a
  report from before it or miss one from its end.
If the private cluster cannot be started, the worker's count on the `--postgres` server is the
headline instead, and the output says so loudly. The cluster is stopped and deleted at the end,
errors included. SQLite (no server) is measured by the worker's own count.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pwd
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import postgres_url, sqlite_url

PG_BIN = Path("/usr/lib/postgresql/15/bin")
READY = "worker started: "  # how `oncebox worker`'s first line begins (cli/run_cmds.py)
WHO = "bench/idle.py"  # the app its start line names
READY_TIMEOUT = 120.0  # seconds a worker gets to import, check its store and say it started
CLUSTER_SETTINGS = """
# bench/idle.py: a throwaway cluster that counts every statement
port = {port}
listen_addresses = '127.0.0.1'
unix_socket_directories = '{sockets}'
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
pg_stat_statements.track_utility = on
shared_buffers = 16MB
fsync = off
"""


class ClusterUnavailable(Exception):
    """The private cluster could not be started; the measurement falls back to the worker's own
    count on the given server."""


def one_line(sql: str, width: int) -> str:
    """A statement on one line, without its comment lines, cut at `width` characters."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    return " ".join(" ".join(lines).split())[:width]


def count_transactions(log: list[tuple[float, str]]) -> None:
    """Record (time, first statement) for every transaction this process starts."""
    depth = threading.local()
    execute, transaction = psycopg.Cursor.execute, psycopg.Connection.transaction

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(depth, "n", 0):
            log.append(
                (
                    time.time(),
                    one_line(query.decode() if isinstance(query, bytes) else str(query), 70),
                )
            )
        return execute(self, query, *args, **kwargs)

    @contextlib.contextmanager
    def counted_transaction(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if not getattr(depth, "n", 0):
            log.append((time.time(), "BEGIN … COMMIT"))
        depth.n = getattr(depth, "n", 0) + 1
        try:
            with transaction(self, *args, **kwargs) as tx:
                yield tx
        finally:
            depth.n -= 1

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    psycopg.Connection.transaction = counted_transaction  # type: ignore[method-assign]


def count_sqlite_transactions(log: list[tuple[float, str]]) -> None:
    """The same for SQLite: the store's connections run in autocommit mode (its writes begin
    with an explicit BEGIN IMMEDIATE), so a statement run outside a transaction starts one."""
    connect = sqlite3.connect

    class Counted(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if not self.in_transaction:
                log.append((time.time(), one_line(sql, 70)))
            return super().execute(sql, *args)

    def counted_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, **{**kwargs, "factory": Counted})

    sqlite3.connect = counted_connect  # type: ignore[assignment]


def idle_worker(url: str, log_path: str) -> None:
    """The worker process (`idle.py --worker URL LOG`): prints `oncebox worker`'s start line once
    its checks have passed, works until SIGTERM, and writes the transactions it started to
    `log_path` as it ends."""
    from oncebox import Box, JobContext, ScheduleContext, SweepContext
    from oncebox.cli.run_cmds import start_line
    from oncebox.jobs.periods import iso_week

    log: list[tuple[float, str]] = []
    # until the worker's own handler replaces it: a SIGTERM unwinds, so the log is still written
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        box = Box(url)  # the worker stores a secret of its own (a new connection: counted or not)
        box.channel("email", provider="null:")

        @box.task(key="idle/{n}")
        def task(ctx: JobContext, n: int) -> None:
            pass

        @box.schedule("weekly", cron="0 9 * * MON", period=iso_week, task=task)
        def nobody(ctx: ScheduleContext) -> Any:
            return []

        @box.sweeper("nothing-due", every=timedelta(seconds=30))
        def sweep(ctx: SweepContext) -> int:
            return 0

        count_transactions(log)
        count_sqlite_transactions(log)
        # what `box.work()` runs, telling its start as `oncebox worker` does; until SIGTERM
        box.worker().run(on_start=lambda started: print(start_line(WHO, started), flush=True))
    finally:
        Path(log_path).write_text(json.dumps(log))


class Running(Protocol):
    """What `wait_until_ready` asks of the worker's process (a `subprocess.Popen`)."""

    def poll(self) -> int | None: ...


def wait_until_ready(worker: Running, output: Path, timeout: float) -> str:
    """Until the worker has printed its start line (whole, in `output`, where its stdout and
    stderr go); returns that line. SystemExit, with the worker's output, if it exits first or
    has not said it within `timeout` seconds (a benchmark's bound, not a test's)."""
    deadline = time.monotonic() + timeout
    while True:
        code = worker.poll()  # before reading: an exited worker's output is all there
        said = output.read_text(errors="replace") if output.exists() else ""
        whole = said.split("\n")[:-1]  # a last line without its newline is still being written
        started = [line for line in whole if line.startswith(READY)]
        if started:
            return started[0]
        if code is not None:
            raise SystemExit(
                f"the idle worker exited (code {code}) before it was ready; its output:\n"
                f"{tail(said)}"
            )
        if time.monotonic() >= deadline:
            raise SystemExit(
                f"the idle worker was not ready within {timeout:g} s (no line beginning "
                f"{READY!r}); its output:\n{tail(said)}"
            )
        time.sleep(0.05)  # a benchmark's poll, not a test's synchronisation


def tail(said: str, width: int = 4000) -> str:
    """The end of a worker's output, for an error message."""
    said = said.strip()
    return ("…" + said[-width:] if len(said) > width else said) or "(nothing)"


def free_port() -> int:
    """A port free on 127.0.0.1 now (should another process take it before the server binds it,
    the start fails and says so)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def private_cluster(pg_bin: Path) -> Iterator[str]:
    """A throwaway PostgreSQL cluster counting every statement, while the block runs: yields the
    URL of its `postgres` database, where pg_stat_statements is created (the view shows every
    database's statements; reading it from there keeps the reads out of the worker's database).
    Its superuser is named after the user libpq connects as by default, so a URL without a user
    (core's `postgres_url`) reaches it. Raises ClusterUnavailable before the block if it cannot
    start; stopped and deleted on exit, errors included."""
    if not (pg_bin / "initdb").exists() or not (pg_bin / "pg_ctl").exists():
        raise ClusterUnavailable(f"no initdb and pg_ctl in {pg_bin}")
    as_user: list[str] = []
    owner = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise ClusterUnavailable("run as root, and no `postgres` user to run initdb") from None
        as_user = ["runuser", "-u", "postgres", "--"]
    superuser = os.environ.get("PGUSER") or pwd.getpwuid(os.geteuid()).pw_name
    with tempfile.TemporaryDirectory(prefix="oncebox_idle_", ignore_cleanup_errors=True) as folder:
        if owner is not None:
            os.chown(folder, owner.pw_uid, owner.pw_gid)
        data, log, port = Path(folder) / "data", Path(folder) / "server.log", free_port()

        def run(program: str, *args: str) -> None:
            try:
                done = subprocess.run(
                    [*as_user, str(pg_bin / program), *args],
                    check=False,
                    capture_output=True,
                    text=True,
                    timeout=90,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ClusterUnavailable(f"{program} {args[0]}: {exc}") from exc
            if done.returncode != 0:
                said = (done.stderr + done.stdout).strip()
                logged = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                raise ClusterUnavailable(f"{program} {args[0]} failed: {said}\n{logged}".strip())

        run("initdb", "-D", str(data), "-U", superuser, "--auth=trust", "--no-sync")
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(CLUSTER_SETTINGS.format(port=port, sockets=folder))
        try:
            run("pg_ctl", "start", "-w", "-t", "60", "-D", str(data), "-l", str(log))
            url = f"postgresql://{superuser}@127.0.0.1:{port}/postgres"
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute("CREATE EXTENSION pg_stat_statements")
            except psycopg.Error as exc:
                raise ClusterUnavailable(f"pg_stat_statements: {exc}") from exc
            yield url
        finally:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    [*as_user, str(pg_bin / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(data)],
                    check=False,
                    capture_output=True,
                    timeout=90,
                )


class ServerCount:
    """What the server counts for one database over the window, read from another database
    (so the reads are not counted): its transactions, and with `statements` pg_stat_statements
    (reset at the window's start)."""

    def __init__(self, conn: psycopg.Connection[Any], database: str, statements: bool) -> None:
        self.conn, self.database, self.statements = conn, database, statements
        self.before = 0

    def transactions(self) -> int:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            (self.database,),
        ).fetchone()
        return int(row[0]) if row else 0

    def start(self) -> None:
        if self.statements:
            self.conn.execute("SELECT pg_stat_statements_reset()")
        self.before = self.transactions()

    def finish(self, seconds: float) -> dict[str, Any]:
        top: collections.Counter[str] = collections.Counter()
        nested: collections.Counter[str] = collections.Counter()
        if self.statements:
            rows = self.conn.execute(
                "SELECT s.query, s.toplevel, s.calls FROM pg_stat_statements s"
                " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
                (self.database,),
            ).fetchall()
            for query, toplevel, calls in rows:
                (top if toplevel else nested)[one_line(query, 90)] += int(calls)
        transactions = self.transactions() - self.before
        figures: dict[str, Any] = {}
        if self.statements:
            figures = {
                "statements": top.total(),
                "statements_per_s": top.total() / seconds,
                "statements_by_query": dict(top.most_common()),
                "nested_statements": nested.total(),
                "nested_by_query": dict(nested.most_common()),
            }
        return {
            **figures,
            "server_transactions": transactions,
            "server_per_s": transactions / seconds,
        }


def measure(
    server: str,
    seconds: float,
    warmup: float,
    pg_bin: Path = PG_BIN,
    ready_timeout: float = READY_TIMEOUT,
) -> dict[str, Any]:
    """Workload 7 on PostgreSQL: on a private cluster, `per_s` is the top-level statements per
    second the server counted in the worker's database; if that cluster cannot be started, on a
    fresh database of `server`, `per_s` is the worker's own transactions per second, and
    `fallback` says why (also printed to stderr)."""
    try:
        with private_cluster(pg_bin) as admin:
            figures = measure_on(admin, seconds, warmup, True, ready_timeout)
            return {"counted_by": "pg_stat_statements", **figures, "fallback": None}
    except ClusterUnavailable as exc:
        reason = str(exc)
    print(
        f"!!! idle worker NOT COUNTED BY THE SERVER: no private cluster ({reason}); counting "
        "the transactions the worker starts instead, on the --postgres server !!!",
        file=sys.stderr,
    )
    figures = measure_on(server, seconds, warmup, False, ready_timeout)
    return {"counted_by": "worker", **figures, "per_s": figures["worker_per_s"], "fallback": reason}


def measure_on(
    server: str,
    seconds: float,
    warmup: float,
    statements: bool,
    ready_timeout: float = READY_TIMEOUT,
) -> dict[str, Any]:
    """Workload 7 on a fresh database of `server`; with `statements`, the server's counts."""
    with postgres_url(server)() as url:
        database = url.rsplit("/", 1)[1]
        with psycopg.connect(server, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            counted = ServerCount(conn, database, statements)
            figures = watch_idle(url, seconds, warmup, counted, ready_timeout)
    per_s = figures["statements_per_s"] if statements else figures["worker_per_s"]
    return {
        "seconds": seconds,
        "per_s": per_s,
        **figures,
        "server_version": str(version[0]).split()[0] if version else "?",
    }


def measure_sqlite(
    seconds: float, warmup: float, ready_timeout: float = READY_TIMEOUT
) -> dict[str, Any]:
    """Workload 7 on a temporary SQLite file (the listener watches its files; no queries):
    `per_s` is the worker's own transactions per second."""
    with sqlite_url() as url:
        figures = watch_idle(url, seconds, warmup, None, ready_timeout)
    return {"seconds": seconds, "counted_by": "worker", "per_s": figures["worker_per_s"], **figures}


def watch_idle(
    url: str,
    seconds: float,
    warmup: float,
    server: ServerCount | None,
    ready_timeout: float = READY_TIMEOUT,
) -> dict[str, Any]:
    """The worker's process from its start to its graceful stop: `warmup` then `seconds` of
    window, both counted from its start line (`wait_until_ready`), never from its spawn."""
    with tempfile.TemporaryDirectory() as folder:
        log_path, output = Path(folder) / "transactions.json", Path(folder) / "worker.out"
        with output.open("w") as out:
            worker = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--worker", url, str(log_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            ready = wait_until_ready(worker, output, ready_timeout)
            time.sleep(warmup)  # a benchmark's window, not a test's synchronisation
            if server:
                server.start()
            start = time.time()
            time.sleep(seconds)
            end = time.time()
            counted = server.finish(seconds) if server else {}
        finally:
            stop(worker)
        said = output.read_text(errors="replace")
        if not log_path.exists():
            raise SystemExit(
                f"the idle worker did not write its transaction log (exit code "
                f"{worker.returncode}); its output:\n{tail(said)}"
            )
        rest = [line for line in said.splitlines() if line != ready]
        if rest:  # what it said beside its start line (warnings): shown, not swallowed
            print("\n".join(f"idle worker: {line}" for line in rest), file=sys.stderr)
        window = [what for at, what in json.loads(log_path.read_text()) if start <= at < end]
    return {
        **counted,
        "worker_transactions": len(window),
        "worker_per_s": len(window) / seconds,
        "by_statement": dict(collections.Counter(window).most_common()),
        "window_start": start,
        "window_end": end,
    }


def stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM (graceful: the worker writes its log), then SIGKILL after 30 s."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(5)


def show(figures: dict[str, Any], key: str, width: int = 6) -> None:
    for what, count in figures[key].items():
        print(f"{count:{width}d}  {what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument(
        "--postgres",
        default="postgresql://127.0.0.1:5432/test",
        help="the server to fall back on when no private cluster can be started",
    )
    parser.add_argument("--pg-bin", type=Path, default=PG_BIN, help="initdb and pg_ctl's folder")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=READY_TIMEOUT,
        help="seconds the worker gets to print its start line",
    )
    parser.add_argument("--worker", nargs=2, metavar=("URL", "LOG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # the worker's own process (`watch_idle`)
        idle_worker(*args.worker)
        return 0
    # a SIGTERM unwinds (stopping the worker and the private cluster) instead of killing outright
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    figures = measure(args.postgres, args.seconds, args.warmup, args.pg_bin, args.ready_timeout)
    seconds = f"{args.seconds:g} s"
    if figures["fallback"] is None:
        print(
            f"idle worker on PostgreSQL: {figures['statements']} statements in {seconds} = "
            f"{figures['per_s']:.2f}/s counted by the server (pg_stat_statements, private "
            f"PostgreSQL {figures['server_version']} cluster; target ≤ 1/s)"
        )
        show(figures, "statements_by_query")
        if figures["nested_statements"]:
            print(f"  and {figures['nested_statements']} run inside functions (not counted):")
            show(figures, "nested_by_query")
    else:
        print(
            f"!!! NOT COUNTED BY THE SERVER: no private cluster could be started "
            f"({figures['fallback']}); the figure is the worker's own count of the transactions "
            "it starts, on the --postgres server !!!"
        )
    print(
        f"idle worker on PostgreSQL, the worker's own count: {figures['worker_transactions']} "
        f"transactions in {seconds} = {figures['worker_per_s']:.2f}/s; pg_stat_database "
        f"counted {figures['server_per_s']:.2f}/s in that database (a lagging cross-check)"
    )
    show(figures, "by_statement")
    local = measure_sqlite(args.seconds, args.warmup, args.ready_timeout)
    print(
        f"idle worker on SQLite: {local['worker_transactions']} transactions in "
        f"{seconds} = {local['per_s']:.2f}/s (target ≤ 2/s)"
    )
    show(local, "by_statement")
    figures = {**figures, "sqlite": local}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
