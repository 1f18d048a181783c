"""PostgreSQL worlds: a database per process, its schema emptied between worlds; every session
of a world named, so the scheduler can ask which of them wait on a lock.

**The database.** Migrating costs 0.4 to 0.7 s, as much as a world takes. So each process
creates one database (`oncebox_sim_<random>`) and migrates one schema there once, runs its
worlds there one after another, and empties the schema after each (`Server.empty`): every table
the world made (`sim_effects`) dropped, every oncebox table emptied, every sequence back to 1, so
the next world starts from the state a fresh migration leaves. A database, not only a schema:
advisory locks are per database, and the relay's group locks (`hashtextextended(queue ||
group_key)`) of two processes' worlds in one database would meet — a wait on another world's
session, which neither scheduler sees or moves. The database is dropped when the process exits.
A process killed first leaves it behind; the session advisory lock its owner held (in the
database the URL names) tells a later process that nobody owns it, and the later process drops
it.

**The sessions.** Every connection of a world carries an `application_name` starting with the
world's tag (`oncebox sim <random>`): the pool's and the checker's through the URL, the
consumers' dedicated sessions through the store's `consumer_connect_params` (a consumer sets its
own `options` — its lock and statement bounds — which replace the URL's; that hook is the one
place where both reach its connection). Each session reads the schema through its `search_path`
(the handler's and the checker's SQL name tables without it) and, where the server lets this role
set it, runs with a short `deadlock_timeout`.

**The probe** (`Probe.waiting`): how many of the world's sessions wait on a lock that another of
the world's sessions holds, and have waited for at least `SETTLED` — read from `pg_locks`, whose
`granted` the releasing backend sets at its commit, not from `pg_stat_activity.wait_event`, which
the waiter clears only when it next runs. Waiting that long means two things: the wait is not a
moment's (the holder is parked, not about to commit), and the waiter's own deadlock check has run
(it runs once, `deadlock_timeout` after the wait begins). So when a later statement closes a
cycle, the deadlock is found by that statement's session — the one the seed chose last — and the
victim is the same in every replay. A lock held by another process's world (the commit-time
NOTIFY lock is per database) is a moment's wait: not counted, the scheduler waits it out.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import errors as pg_errors

from oncebox.kernel.errors import ConfigurationError, StoreUnavailable
from oncebox.kernel.inert import redact
from oncebox.store import open_store
from oncebox.store.postgres import split_url

DEADLOCK_TIMEOUT_MS = 5  # the world's sessions' deadlock_timeout, where the server allows it
SETTLED_TIMEOUTS = 20  # a wait counts once it has lasted this many deadlock timeouts
SCHEMA_PREFIX = "oncebox_sim_"
POOL = "pool_min=1&pool_max=8"  # a world's actors hold a pooled connection one call at a time

# The world's sessions that wait on a lock another of its sessions holds, waiting for at least
# %(settled)s seconds (a wait just begun has a NULL waitstart: not yet counted).
WAITING_SQL = """
SELECT count(DISTINCT l.pid)
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted
  AND a.application_name LIKE %(names)s
  AND l.waitstart < clock_timestamp() - make_interval(secs => %(settled)s)
  AND EXISTS (SELECT 1 FROM pg_stat_activity h
              WHERE h.pid = ANY (pg_blocking_pids(l.pid)) AND h.application_name LIKE %(names)s)
"""
LEFTOVERS_SQL = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE application_name LIKE %(names)s AND pid <> pg_backend_pid()"
)
LOCK_KEY = "hashtextextended('oncebox-sim:' || %(name)s, 0)"


def _fail(server: str, exc: psycopg.Error) -> StoreUnavailable:
    detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return StoreUnavailable(f"oncebox sim: PostgreSQL at {redact(server)}: {detail}")


class Server:
    """One process's place on a server: its database and schema, migrated once; the connection
    to the URL's database that holds its advisory lock (and drops it at exit); and the admin
    connection in its own, which empties the schema and runs the probe."""

    def __init__(self, url: str) -> None:
        self.url = url
        conninfo, ours = split_url(url)
        if ours:
            raise ConfigurationError(
                f"--store {redact(url)}: give the server and database only; each world makes "
                f"its own schema and pool (remove {', '.join(sorted(ours))})"
            )
        name = f"{SCHEMA_PREFIX}{uuid.uuid4().hex[:12]}"
        self.database = self.schema = name
        self.conninfo = _in_database(conninfo, name)
        self.lock = threading.Lock()
        try:
            # in the database the URL names: the lock that says this process is alive
            self.root = psycopg.connect(
                conninfo, autocommit=True, application_name="oncebox sim admin"
            )
            self.root.execute(f"SELECT pg_advisory_lock({LOCK_KEY})", {"name": name})
            self._sweep()
            self.root.execute(f'CREATE DATABASE "{name}"'.encode())
            self.admin = psycopg.connect(
                self.conninfo, autocommit=True, application_name="oncebox sim admin"
            )
            self.deadlock_ms = self._deadlock_timeout()
            store = open_store(self.world_url("oncebox sim migrate"), migrate=True)
            store.close()
            self.tables = self._referencing_first(self._relations("r"))
            self.sequences = self._relations("S")
        except psycopg.Error as exc:
            raise _fail(url, exc) from None
        # the waiter's own deadlock check has run: twenty times its timeout (a backend the host
        # starves of CPU runs it late: on a loaded 2-core machine four times was not enough),
        # or a second past the server's own, where the role may not shorten it
        late = min((SETTLED_TIMEOUTS - 1) * self.deadlock_ms, 1000)
        self.settled = (self.deadlock_ms + late) / 1000
        atexit.register(self.drop)

    def _sweep(self) -> None:
        """Drop the databases of processes that died before dropping theirs (nobody holds their
        lock), and the schemas an older release's processes left in the URL's database."""
        like = {"p": SCHEMA_PREFIX.replace("_", r"\_") + "%"}
        found = [
            (f'DATABASE IF EXISTS "{name}" WITH (FORCE)', name)
            for (name,) in self.root.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %(p)s", like
            )
        ] + [
            (f'SCHEMA IF EXISTS "{name}" CASCADE', name)
            for (name,) in self.root.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE %(p)s", like
            )
        ]
        for what, name in found:
            key = {"name": name}
            [(free,)] = self.root.execute(f"SELECT pg_try_advisory_lock({LOCK_KEY})", key)
            if free:
                self.root.execute(f"DROP {what}".encode())
                self.root.execute(f"SELECT pg_advisory_unlock({LOCK_KEY})", key)

    def _deadlock_timeout(self) -> int:
        """A short deadlock_timeout when this role may set it (a superuser's, or one granted
        SET); else the server's own (each blocked statement then waits four of them)."""
        try:
            self.admin.execute(f"SET deadlock_timeout = {DEADLOCK_TIMEOUT_MS}".encode())
        except pg_errors.InsufficientPrivilege:
            [(setting,)] = self.admin.execute(
                "SELECT setting::int FROM pg_settings WHERE name = 'deadlock_timeout'"
            )
            return int(setting)
        self.admin.execute(b"RESET deadlock_timeout")
        return DEADLOCK_TIMEOUT_MS

    def _relations(self, kind: str) -> list[str]:
        rows = self.admin.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %(schema)s AND c.relkind = %(kind)s ORDER BY c.relname",
            {"schema": self.schema, "kind": kind},
        ).fetchall()
        return [name for (name,) in rows]

    def _referencing_first(self, tables: list[str]) -> list[str]:
        """`tables` in an order a DELETE of each can follow: a table before any it references
        (an Idempotency-Key record before its API key)."""
        rows = self.admin.execute(
            "SELECT c.conrelid::regclass::text, c.confrelid::regclass::text FROM pg_constraint c "
            "JOIN pg_namespace n ON n.oid = c.connamespace "
            "WHERE n.nspname = %(schema)s AND c.contype = 'f' AND c.conrelid <> c.confrelid",
            {"schema": self.schema},
        ).fetchall()
        references = {(child.split(".")[-1], parent.split(".")[-1]) for child, parent in rows}
        ordered: list[str] = []
        left = list(tables)
        while left:  # the schema's references form no cycle: each pass places one table
            ready = next(t for t in left if not any(p == t and c in left for c, p in references))
            ordered.append(ready)
            left.remove(ready)
        return ordered

    def options(self) -> str:
        """libpq `options` for every session of a world."""
        deadlock = f" -c deadlock_timeout={self.deadlock_ms}" if self._short_deadlocks else ""
        # the simulation tests orders, not the disk: no commit waits for its WAL flush
        return f"-c search_path={self.schema} -c synchronous_commit=off{deadlock}"

    @property
    def _short_deadlocks(self) -> bool:
        return self.deadlock_ms == DEADLOCK_TIMEOUT_MS

    def world_url(self, name: str) -> str:
        base, _, query = self.conninfo.partition("?")
        ours = (
            f"schema={self.schema}&{POOL}&application_name={quote(name, safe='')}"
            f"&options={quote(self.options(), safe='')}"
        )
        return f"{base}?{ours}" + (f"&{query}" if query else "")

    def empty(self) -> None:
        """The schema as a fresh migration leaves it: the world's own tables dropped, oncebox's
        emptied (`oncebox_migrations` kept), the sequences back to their start. DELETE, not
        TRUNCATE: a world leaves a few hundred rows, and TRUNCATE's new files for every table
        and index cost 0.7 s a world against 0.02 (twice over: a row's delete may write another
        table's, as the depth triggers do)."""
        made = set(self._relations("r")) - set(self.tables)
        emptied = [f'"{self.schema}"."{t}"' for t in self.tables if t != "oncebox_migrations"]
        with self.admin.transaction():
            for table in sorted(made):
                self.admin.execute(f'DROP TABLE "{self.schema}"."{table}" CASCADE'.encode())
            for table in emptied + emptied:
                self.admin.execute(f"DELETE FROM {table}".encode())
            if self.sequences:
                restart = ", ".join(
                    f'setval(\'"{self.schema}"."{s}"\', 1, false)' for s in self.sequences
                )
                self.admin.execute(f"SELECT {restart}".encode())

    def drop(self) -> None:
        with contextlib.suppress(psycopg.Error):
            self.admin.close()
            if not self.root.closed:
                database = f'"{self.database}"'
                self.root.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)".encode())
                self.root.close()


@dataclass
class Probe:
    """One world's tag and how to count its waiting sessions (see the module docstring)."""

    server: Server
    tag: str

    @property
    def names(self) -> str:
        return self.tag + " %"

    def waiting(self) -> int:
        params = {"names": self.names, "settled": self.server.settled}
        [(count,)] = self.server.admin.execute(WAITING_SQL, params)
        return int(count)

    def attach(self, store: Any) -> None:
        """The world's consumer sessions named after their actor's thread, in the world's
        schema, with the world's deadlock_timeout (see the module docstring)."""
        options = self.server.options()

        def params() -> dict[str, Any]:
            actor = threading.current_thread().name.removeprefix("sim:")
            return {
                "conninfo": store.conninfo,
                "application_name": f"{self.tag} {actor}"[:63],
                "options": options,
            }

        store.consumer_connect_params = params

    def end(self) -> None:
        """Whatever session of the world outlived it (an actor still blocked when the run
        stopped) is ended, so that the schema can be emptied."""
        self.server.admin.execute(LEFTOVERS_SQL, {"names": self.names})


def _in_database(conninfo: str, name: str) -> str:
    """`conninfo` (a URL, as `split_url` leaves it) on the database `name` of the same server:
    the URL's path names it (a `dbname=` in its query would override the path: dropped)."""
    scheme, _, rest = conninfo.partition("://")
    base, _, query = rest.partition("?")
    kept = [piece for piece in query.split("&") if piece and not piece.startswith("dbname=")]
    authority = base.partition("/")[0]
    return f"{scheme}://{authority}/{name}" + ("?" + "&".join(kept) if kept else "")


_SERVERS: dict[str, Server] = {}


@contextlib.contextmanager
def world_database(url: str) -> Iterator[tuple[str, Probe]]:
    """A world's URL on the server `url` names, and its probe; the schema emptied after."""
    server = _SERVERS.get(url)
    if server is None or server.root.closed:
        server = _SERVERS[url] = Server(url)
    probe = Probe(server, f"oncebox sim {uuid.uuid4().hex[:10]}")
    with server.lock:
        try:
            yield server.world_url(f"{probe.tag} pool"), probe
        finally:
            try:
                probe.end()
                server.empty()
            except psycopg.Error as exc:
                raise _fail(url, exc) from None
