"""The SQLite store: the embedded default, zero set-up.

Durability, stated exactly: the database runs in WAL mode with `synchronous=FULL` by default, so
a committed transaction (an enqueue, a claim, a completion) survives a power loss or an operating
system crash, not only a process crash. `synchronous=NORMAL` (opt-in, `?synchronous=normal`) is
faster and still never corrupts the database, but a power loss can undo the last transactions
before the most recent checkpoint — jobs enqueued or completed in that window would be lost or run
again (the intent would be rolled back with the work, so nothing runs twice *and* commits twice).

Concurrency: SQLite has one writer at a time. Every write begins with `BEGIN IMMEDIATE` and waits
up to `busy_timeout` for the lock; a consumer transaction holds it while its handlers run, so keep
SQLite handlers short. Each thread gets its own connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, LiteralString, cast

from oncebox.kernel import clock
from oncebox.kernel.clock import ClockFile, ClockSetting, from_micros, to_micros
from oncebox.kernel.errors import (
    ConfigurationError,
    SchemaError,
    StoreRefused,
    StoreReplaced,
    StoreUnavailable,
)
from oncebox.kernel.metrics import Metrics, operation
from oncebox.store import allocation, forks, guard
from oncebox.store import limited as limited_lease
from oncebox.store.caller import driver_connection
from oncebox.store.limited import SURVEY
from oncebox.store.migrations import split_sqlite_script
from oncebox.store.params import (
    EVERY_KIND,
    Audit,
    BucketSpec,
    ConsumerSettings,
    InsertRow,
    IntentClaim,
    JobFinish,
    JobLeaseParams,
    JobReleaseParams,
    KeyCanary,
    LimitPlan,
    OutboxFinishParams,
    OutboxInsert,
    OutboxLeaseParams,
    PruneKind,
    RelayedFinish,
    WorkerBeat,
    WorkKind,
    insert_chunks,
)
from oncebox.store.protocol import RELAY_NEEDS_POSTGRES, HandlerConnection
from oncebox.store.pruning import PruneOperations
from oncebox.store.records import (
    ActionResult,
    BucketState,
    DueTime,
    HistoryTended,
    LeasedJob,
    OutboxLeased,
    RelayedRow,
    RescuedJob,
    ScheduleRunTakeOver,
    SchemaStatus,
)
from oncebox.store.rows import Result
from oncebox.store.sqlfiles import Migration, load_migrations, load_queries
from oncebox.store.sqlite_turns import WriterTurns
from oncebox.store.writes import WriteOperations, beat_params, canary_params

_MICRO = timedelta(microseconds=1)
INSERT_CHUNK = 5000
INSERT_CHUNK_CHARS = 16 * 1024 * 1024
WATCH_EVERY = 0.05  # seconds between two looks at the database files for a commit
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}


def _us(delta: timedelta | None) -> int | None:
    return None if delta is None else delta // _MICRO


def _dt(micros: int | None) -> datetime | None:
    return None if micros is None else from_micros(micros)


def _result(sql: str, cursor: sqlite3.Cursor) -> Result:
    """A statement's rows, read by column name (`store/rows.py`)."""
    rows = cursor.fetchall()
    return Result(sql, rows, lambda: [d[0] for d in cursor.description], cursor.rowcount)


def _translate(exc: sqlite3.Error, where: Path) -> Exception:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreUnavailable(
            f"the SQLite database {where} stayed locked by another writer past the busy "
            f"timeout ({text}); nothing was written"
        )
    if "disk I/O" in text or "full" in text:
        return StoreUnavailable(
            f"cannot write the SQLite database {where}: {text} (is its disk full, or failing?)"
        )
    if "unable to open" in text or "readonly" in text:
        return StoreUnavailable(f"cannot write the SQLite database {where}: {text}")
    if "no such table: oncebox_" in text:
        return SchemaError(
            f"the oncebox tables are missing in {where} ({text}): run `oncebox migrate`"
        )
    if "not a database" in text:
        return SchemaError(
            f"{where} is not a SQLite database ({text}): is the URL's path the right file?"
        )
    if "malformed" in text or "corrupt" in text:
        return SchemaError(
            f"the SQLite database {where} is damaged ({text}): stop its writers and restore "
            f"it from a backup (`sqlite3 {where} 'PRAGMA integrity_check'` lists the damage)"
        )
    return exc


def _create_private(path: Path) -> None:
    """Create a new database file readable by its owner only: it holds the outbox secret and
    every rendered message, and SQLite gives its `-wal` and `-shm` files the same mode. A file
    that exists keeps the mode its operator gave it."""
    with contextlib.suppress(OSError):  # it exists; or a read-only folder SQLite will report
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


class SqliteStore(WriteOperations["SqliteTx"], PruneOperations["SqliteTx"]):
    """See the module docstring. Open with `open_store("sqlite:///path.db")`."""

    dialect: Literal["sqlite"] = "sqlite"
    supports_notifications = True  # by watching the database files: see `wait_for_work`
    keeps_history = False  # finished jobs stay in the jobs table

    def __init__(
        self,
        path: Path,
        *,
        url: str,
        busy_timeout: timedelta = timedelta(seconds=10),
        synchronous: str = "full",
        migrate: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        if synchronous.lower() not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"synchronous={synchronous!r} is not one of {', '.join(_SYNCHRONOUS)}"
            )
        self.path = path
        self.url = url
        self.metrics = metrics or Metrics()
        self.busy_timeout = busy_timeout
        self.synchronous = _SYNCHRONOUS[synchronous.lower()]
        self.clock_file = ClockFile(Path(f"{path}.clock"))
        self._turns = WriterTurns(path, busy_timeout.total_seconds())
        self._wal = Path(f"{path}-wal")
        self._q = load_queries("sqlite")
        # the statements that compare with the clock: only they pay for reading it
        self._timed = {name for name, sql in self._q.items() if ":now" in sql}
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._identity: tuple[int, int] | None = None
        self._settled = False  # from here on a connection opens the file it found, or fails
        if not path.parent.exists():
            raise ConfigurationError(f"the directory of the SQLite database {path} does not exist")
        _create_private(path)
        if migrate:
            self.schema_migrate()
        self._identity = self._file_identity()  # a restore moved into place is another file
        self._settled = True
        self._opened = self._files_state()  # a commit from now on wakes `wait_for_work`
        self._watchers = threading.local()  # each listener's last look (a box can run several)
        # where handlers write through an ORM that configures its connections (Django's SQL
        # functions): how it opens one, for the consumers' own
        self.consumer_connect: Callable[[], sqlite3.Connection] | None = None
        forks.watch(self)

    def job_relay_check(self, ids: Sequence[int]) -> dict[int, RelayedRow]:
        raise ConfigurationError(RELAY_NEEDS_POSTGRES)

    def job_relay_adopt(self, queues: Sequence[str], tasks: Sequence[str], limit: int) -> int:
        raise ConfigurationError(RELAY_NEEDS_POSTGRES)

    def job_bury_relayed(self, finishes: Sequence[RelayedFinish]) -> set[int]:
        raise ConfigurationError(RELAY_NEEDS_POSTGRES)

    def forget_inherited(self) -> list[object]:
        """After a fork, in the child: connections of its own, opened when first needed (SQLite
        forbids carrying an open connection across a fork; `store/forks.py`)."""
        inherited: list[object] = list(self._all)
        self._all, self._all_lock = [], threading.Lock()
        self._local, self._watchers = threading.local(), threading.local()
        return inherited

    # -- connections ---------------------------------------------------------------------------

    def connect(self, driver: Callable[[], sqlite3.Connection] | None = None) -> sqlite3.Connection:
        """A new connection with oncebox's pragmas and `oncebox_now()` registered. Once the store
        is open, a connection never creates the file: a lane whose first connection comes after
        the file was deleted or replaced says so (`check_identity`), instead of leaving an empty
        database at the path and reporting its missing tables. `driver` opens it instead of
        sqlite3 (an ORM's connection, with its functions: `consumer_connect`)."""
        if self._settled:
            self.check_identity()
        try:
            if driver is None:
                conn = sqlite3.connect(
                    f"{self.path.absolute().as_uri()}?mode=rw" if self._settled else self.path,
                    uri=self._settled,
                    isolation_level=None,
                    check_same_thread=False,
                    timeout=self.busy_timeout.total_seconds(),
                )
            else:
                conn = driver()
                conn.isolation_level = None  # oncebox begins its transactions itself
                self._check_same_file(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(
                f"PRAGMA busy_timeout={int(self.busy_timeout / timedelta(milliseconds=1))}"
            )
            conn.create_function("oncebox_now", 0, self.clock_file.now_micros)
        except sqlite3.Error as exc:
            if self._settled:  # gone between the look and the open
                self.check_identity()
            raise _translate(exc, self.path) from None
        with self._all_lock:
            self._all.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.connect()
            self._local.conn = conn
        return conn

    def _now(self) -> int:
        return self.clock_file.now_micros()

    @contextmanager
    def _write(
        self, conn: sqlite3.Connection | None = None, greedy: bool = False
    ) -> Iterator[sqlite3.Connection]:
        """A write transaction: the write lock, taken in turn (see `sqlite_turns.py`; `greedy`
        for the consumer, which takes it again and again), committed or rolled back."""
        conn = conn or self._conn()
        try:
            self._turns.begin(conn, greedy)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None
        try:
            yield conn
        except sqlite3.Error as exc:  # a statement of the transaction: a full disk, say
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            translated = _translate(exc, self.path)
            if translated is exc:
                raise
            raise translated from None
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise _translate(exc, self.path) from None

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    # -- what the shared operations ask of SQLite (store/reads.py, store/writes.py) ------------

    def _instant(self, value: Any) -> datetime | None:
        return _dt(value)

    def _at(self, instant: datetime | None) -> int | None:
        return None if instant is None else to_micros(instant)

    def _span(self, name: str, delta: timedelta | None) -> dict[str, Any]:
        return {f"{name}_us": _us(delta)}

    def _set(self, values: Sequence[Any]) -> str:
        return json.dumps(list(values))

    def _fetch(self, name: str, params: dict[str, Any], connection: object | None = None) -> Result:
        """A read; `:now` is bound for the queries that compare with the clock."""
        sql = self._q[name]
        conn = self._conn() if connection is None else self._external(connection)
        if name in self._timed:
            params = {"now": self._now(), **params}
        try:
            return _result(sql, conn.execute(sql, params))
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None

    def _apply(self, name: str, params: dict[str, Any], connection: object | None = None) -> Result:
        """A write: under the write lock (`:now` read once it is held), or in the caller's
        transaction on `connection`."""
        if connection is not None:
            return self._fetch(name, params, connection)
        sql = self._q[name]
        try:
            with self._write() as conn:
                if name in self._timed:
                    params = {"now": self._now(), **params}
                return _result(sql, conn.execute(sql, params))
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None

    def _insert_job(self, params: dict[str, Any], connection: object | None) -> Result:
        """`job_insert` and its count, in one transaction: the caller's, or one of its own."""
        if connection is not None:
            inserted = self._fetch("job_insert", params, connection)
            self._fetch("job_insert__count", {"created": int(bool(inserted.rows))}, connection)
            return inserted
        with self._transaction() as tx:
            inserted = tx.fetch("job_insert", params)
            tx.fetch("job_insert__count", {"created": int(bool(inserted.rows))})
        return inserted

    def _insert_collapsed(self, params: dict[str, Any], connection: object | None) -> Result:
        """`job_insert_collapsed`, a throttle's last run and the count, in one transaction."""
        with self._either(connection) as tx:
            inserted = tx.fetch("job_insert_collapsed", params)
            if inserted.rows and params["throttle"]:
                run_at = inserted.first("run_at")
                tx.fetch("job_insert_collapsed__throttle", {**params, "run_at": run_at})
            if inserted.rows or params["key"] is not None:
                tx.fetch("job_insert__count", {"created": int(bool(inserted.rows))})
        return inserted

    def _merge_job(self, params: dict[str, Any], connection: object | None) -> Result:
        with self._either(connection) as tx:
            merged = tx.fetch("job_merge", params)
            if merged.rows:
                tx.fetch("job_merge__count", {})
        return merged

    def _either(self, connection: object | None) -> AbstractContextManager[SqliteTx]:
        """The caller's transaction on `connection`, or one of the store's own."""
        return self._transaction() if connection is None else self._caller_transaction(connection)

    def counter_compact(self) -> int:
        """One writer, one shard: nothing to fold."""
        return 0

    def _count_inserted(self, tx: SqliteTx, offered: int, created: int) -> None:
        tx.fetch("job_insert_many__count", {"offered": offered, "created": created})

    @contextmanager
    def _transaction(self) -> Iterator[SqliteTx]:
        with self._write() as conn:
            yield SqliteTx(self._q, conn, self._now())  # the clock, read under the write lock

    @contextmanager
    def _caller_transaction(self, connection: object) -> Iterator[SqliteTx]:
        """The caller's transaction on its own sqlite3 connection, which holds the write lock
        once it has written."""
        conn = self._external(connection)
        try:
            yield SqliteTx(self._q, conn, self._now())
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None

    # -- schema --------------------------------------------------------------------------------

    def schema_status(self) -> SchemaStatus:
        known = tuple(m.version for m in load_migrations("sqlite"))
        conn = self._conn()
        try:
            conn.execute(self._q["migration_table_create"])
            listed = _result(self._q["migration_list"], conn.execute(self._q["migration_list"]))
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None
        version = listed.columns()["version"]
        return SchemaStatus(applied=tuple(row[version] for row in listed.rows), known=known)

    def _migrations(self) -> list[Migration]:
        return load_migrations("sqlite")

    def _migration_transaction(
        self, connection: object | None = None
    ) -> AbstractContextManager[SqliteTx]:
        if connection is not None:  # SQLite's DDL would commit on its own in the caller's
            raise ConfigurationError(
                "a SQLite file is migrated when a Box opens it, not in the caller's transaction"
            )
        return self._transaction()  # BEGIN IMMEDIATE: one migrating process at a time

    def _migration_apply(self, tx: SqliteTx, migration: Migration) -> None:
        try:
            for statement in split_sqlite_script(migration.sql):
                tx.conn.execute(statement)
        except sqlite3.Error as exc:
            raise SchemaError(
                f"migration {migration.version} ({migration.name}) failed on "
                f"{self.path}: {exc}; nothing of it was applied"
            ) from None

    # -- clock ---------------------------------------------------------------------------------

    def clock_now(self) -> datetime:
        return from_micros(self._now())

    def clock_set(self, setting: ClockSetting, audit: Audit | None = None) -> None:
        if audit is None:
            self.clock_file.write(setting)
            return
        was = self.clock_file.read().describe()
        with self._write() as conn:  # the audit entry commits only if the file was written
            self.clock_file.write(setting)
            params = {"now": self._now(), "actor": audit.actor, "reason": audit.reason}
            conn.execute(self._q["clock_audit"], {**params, "details": json.dumps({"was": was})})

    def clock_get(self) -> ClockSetting:
        return self.clock_file.read()

    # -- enqueue -------------------------------------------------------------------------------

    def _external(self, connection: object) -> sqlite3.Connection:
        connection = driver_connection(connection)
        if isinstance(connection, guard.GuardedConnection) and connection.wraps(sqlite3.Connection):
            # a handler's (`connection=ctx.connection`): the job is written through the guard,
            # in the handler's savepoint, on the claim's connection (which holds the write lock)
            self._check_same_file(cast(sqlite3.Connection, connection))
            return cast(sqlite3.Connection, connection)
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                f"connection= must be a sqlite3.Connection for a SQLite box, not "
                f"{type(connection).__name__}"
            )
        self._check_same_file(connection)
        return connection

    def _check_same_file(self, connection: sqlite3.Connection) -> None:
        files = [row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"]
        if not files or Path(files[0]).resolve() != self.path.resolve():
            raise ConfigurationError(
                f"connection= is open on {files[0] if files else 'an unnamed database'}, not on "
                f"this box's database {self.path}; the job would be written elsewhere"
            )

    def _insert_batches(self, rows: Iterable[InsertRow]) -> list[tuple[int, str]]:
        # drawn, checked and encoded before the write lock: one writer at a time, so no overlap
        # to win, and every other writer would wait on the caller's rows
        return [
            (len(chunk), json.dumps(chunk))
            for chunk in insert_chunks(rows, INSERT_CHUNK, INSERT_CHUNK_CHARS)
        ]

    # -- jobs ----------------------------------------------------------------------------------

    @operation
    def job_rescue_expired(self, limit: int) -> list[RescuedJob]:
        with self._transaction() as tx:
            rescued = tx.fetch("job_rescue_expired", {"limit": limit})
            if rescued.rows:
                fields = ("id", "attempt", "worker", "leased_at", "last_error")
                record = itemgetter(*itemgetter(*fields)(rescued.columns()))
                tx.fetch(
                    "job_rescue_expired__record",
                    {"rows": json.dumps([record(r) for r in rescued.rows])},
                )
                state = rescued.columns()["state"]
                dead = sum(1 for row in rescued.rows if row[state] == "dead")
                tx.fetch("job_rescue_expired__count", {"dead": dead, "rescued": len(rescued.rows)})
        return rescued.records(RescuedJob, _dt)

    def _audited(self, name: str, params: dict[str, Any]) -> ActionResult | None:
        """The action (`name`), then its audit row (`name__audit`) from what the action returned,
        in one transaction."""
        with self._transaction() as tx:
            return self._audited_in(tx, name, params)

    def _audited_in(self, tx: SqliteTx, name: str, params: dict[str, Any]) -> ActionResult | None:
        """The same in the caller's transaction `tx`."""
        acted = tx.fetch(name, params)
        if not acted.rows:
            return None
        row = dict(zip(acted.columns(), acted.rows[0], strict=True))
        audit = tx.fetch(f"{name}__audit", {"attempt": None, **params, **row})
        return ActionResult(job_id=row["id"], key=row["key"], audit_id=audit.first("id"))

    # -- due times, pruning --------------------------------------------------------------------

    @operation
    def job_history_drop(
        self, keep: Mapping[str, timedelta | None], default: timedelta | None
    ) -> int:
        """SQLite keeps its finished jobs in its jobs table: `job_prune` deletes them."""
        return 0

    @operation
    def job_history_tend(self, ahead: timedelta, limit: int) -> HistoryTended:
        """SQLite keeps its finished jobs in its jobs table (see `Store.job_history_tend`)."""
        return HistoryTended(0, 0, 0)

    @operation
    def job_prune(self, task: str, older_than: timedelta, limit: int) -> int:
        with self._transaction() as tx:
            params = {"task": task, "older_than_us": _us(older_than), "limit": limit}
            pruned = tx.fetch("job_prune", params)
            c = pruned.columns()
            ids = [row[c["id"]] for row in pruned.rows]
            summarised = [
                [row[c["id"]], row[c["schedule"]], row[c["period"]], row[c["finished_at"]]]
                for row in pruned.rows
                if row[c["schedule"]] is not None and row[c["state"]] == "done"
            ]
            if summarised:
                tx.fetch("job_prune__summarise", {"pruned": json.dumps(summarised)})
            if ids:
                tx.fetch("job_prune__attempts", {"ids": json.dumps(ids)})
                tx.fetch("counter_add", {"deltas": json.dumps({"pruned_jobs": len(ids)})})
        return len(ids)

    def _prune_in(self, tx: SqliteTx, kind: PruneKind, params: dict[str, Any]) -> int:
        """A batch of messages in three steps (SQLite has no data-modifying CTEs): the batch,
        its attempts, the rows."""
        if kind != "messages":
            return super()._prune_in(tx, kind, params)
        batch = tx.fetch("outbox_prune__select", params)
        ids = json.dumps([row[0] for row in batch.rows])
        tx.fetch("outbox_prune__attempts", {"ids": ids})
        return len(tx.fetch("outbox_prune", {"ids": ids}).rows)

    # -- the outbox ----------------------------------------------------------------------------

    @operation
    def outbox_lease(self, params: OutboxLeaseParams) -> list[OutboxLeased]:
        values: dict[str, Any] = {
            "channels": json.dumps(list(params.channels)),
            "limit": params.limit,
            "worker": params.worker,
            "token": params.token,
            "lease_us": _us(params.lease_for),
        }
        with self._write() as conn:
            values["now"] = self._now()
            leased = _result(self._q["outbox_lease"], conn.execute(self._q["outbox_lease"], values))
        return self._leased_outbox(leased, params.token)

    @operation
    def outbox_finish(self, token: str, finishes: Sequence[OutboxFinishParams]) -> set[int]:
        if not finishes:
            return set()
        with self._write() as conn:
            return self._finish_outbox(conn, self._now(), token, finishes)

    def _outbox_finish_in(
        self, tx: SqliteTx, token: str, finishes: Sequence[OutboxFinishParams]
    ) -> set[int]:
        return self._finish_outbox(tx.conn, tx.now_us, token, finishes)

    def _finish_outbox(
        self, conn: sqlite3.Connection, now: int, token: str, finishes: Sequence[OutboxFinishParams]
    ) -> set[int]:
        payload = json.dumps(
            [
                [
                    f.id,
                    f.state,
                    f.outcome,
                    int(f.counts_attempt),
                    _us(f.delay),
                    f.error,
                    f.receipt,
                    int(f.possible_duplicate),
                    None if f.uncertain is None else int(f.uncertain),
                    int(f.rescued),
                ]
                for f in finishes
            ]
        )
        sql = self._q["outbox_finish"]
        settled = _result(sql, conn.execute(sql, {"rows": payload, "token": token, "now": now}))
        id_, attempt, worker, started = itemgetter("id", "attempt", "leased_by", "leased_at")(
            settled.columns()
        )
        by_id = {f.id: f for f in finishes}
        records = [
            [r[id_], r[attempt], r[worker], r[started], f.outcome, f.error, f.receipt]
            for r in settled.rows
            if (f := by_id[r[id_]]).outcome is not None
        ]
        if records:
            conn.execute(
                self._q["outbox_finish__record"], {"rows": json.dumps(records), "now": now}
            )
        ids = [row[id_] for row in settled.rows]
        if ids:
            conn.execute(
                self._q["outbox_finish__count"], {"rows": payload, "settled": json.dumps(ids)}
            )
        return set(ids)

    # -- rate limits ---------------------------------------------------------------------------

    @operation
    def rate_bucket_configure(self, channel: str, specs: Sequence[BucketSpec]) -> None:
        buckets = json.dumps([[b.name, b.capacity, b.refill_per_s] for b in specs])
        self._apply("rate_bucket_configure", {"channel": channel, "buckets": buckets})

    def _bucket_update(self, buckets: Sequence[BucketState]) -> dict[str, Any]:
        rows = [[b.name, b.tokens, to_micros(b.updated_at)] for b in buckets]
        return {"buckets": json.dumps(rows)}

    # -- the key-drift guard ---------------------------------------------------------------------

    @operation
    def key_canary_accept(self, canary: KeyCanary, actor: str, reason: str) -> int:
        with self._transaction() as tx:
            found = tx.fetch("key_canary_get", {"kind": canary.kind, "name": canary.name})
            previous = found.rows[0] if found.rows else None
            source, outputs = itemgetter("source", "outputs")(found.columns())
            params = {
                **canary_params(canary),
                "actor": actor,
                "reason": reason,
                "was": previous[source] if previous else None,
                "was_outputs": previous[outputs] if previous else None,
            }
            tx.fetch("key_canary_accept", params)
            return int(tx.fetch("key_canary_accept__audit", params).first("id"))

    @operation
    def schedule_run_take_over(self, take: ScheduleRunTakeOver) -> int | None:
        params = self._take_over(take)
        with self._transaction() as tx:
            if not tx.fetch("schedule_run_take_over", params).rows:
                return None
            return int(tx.fetch("schedule_run_take_over__audit", params).first("id"))

    # -- workers -------------------------------------------------------------------------------

    @operation
    def worker_beat(self, beat: WorkerBeat) -> None:
        with self._transaction() as tx:
            tx.fetch("worker_beat", beat_params(beat))
            tx.fetch("worker_beat__forget", {"name": beat.name})

    # -- lanes ---------------------------------------------------------------------------------

    def consumer_session(self, settings: ConsumerSettings) -> SqliteConsumerSession:
        return SqliteConsumerSession(self, self.connect(self.consumer_connect))

    def wait_for_work(self, timeout: float) -> frozenset[WorkKind]:
        """Wait for a commit by any process (it may hold work of every kind). SQLite has no
        notifications, but every commit writes the database files — the write-ahead log, or the
        database itself when the log is checkpointed — so a change of their size, modification
        time or inode, seen with a `stat` every `WATCH_EVERY` seconds, wakes an idle worker
        without a query. Each calling thread compares with its own last look, from the state
        when the store was opened. A change it cannot see (a filesystem with coarse timestamps,
        where a rewritten log can keep its size) still reaches the lanes by their poll
        interval."""
        deadline = clock.monotonic() + timeout
        seen = getattr(self._watchers, "state", self._opened)
        while True:
            state = self._files_state()
            if state != seen:
                self._watchers.state = state
                return EVERY_KIND
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                self._watchers.state = state
                return frozenset()
            clock.sleep(min(WATCH_EVERY, remaining))

    def _files_state(self) -> tuple[tuple[int, int, int] | None, ...]:
        def state(path: Path) -> tuple[int, int, int] | None:
            try:
                found = path.stat()
            except OSError:  # not there (yet), or not readable: nothing to compare, the poll covers
                return None
            return found.st_ino, found.st_mtime_ns, found.st_size

        return state(self.path), state(self._wal)

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            found = self.path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:  # a stale network mount, a folder made unreadable: retry later
            raise StoreUnavailable(
                f"cannot look at the SQLite database {self.path}: {exc.strerror or exc}"
            ) from None
        return found.st_dev, found.st_ino

    def check_identity(self) -> None:
        """The file at the path is still the one this store opened. A restore moved into place
        (or a deletion) leaves open connections on the old inode, where every commit is lost
        to everyone else — so a worker stops and, restarted, opens what is there now. A copy
        over the file in place keeps the inode; the connections read the new content."""
        now = self._file_identity()
        if now == self._identity:
            return
        how = "deleted" if now is None else "replaced"
        raise StoreReplaced(
            f"the SQLite database {self.path} was {how} while this process had it open "
            f"(a restore from backup?): stopping rather than serve the old file; start the "
            "worker again to open the one now at that path"
        )

    def notify_work(self, kind: WorkKind) -> None:
        """Nothing to send: the commit that made rows ready changed the files (see
        `wait_for_work`)."""


class SqliteTx:
    """A write transaction on SQLite (`SqliteStore._transaction`): every statement is bound the
    clock as read once the write lock was held (`:now`), so all of them see one instant."""

    __slots__ = ("_q", "conn", "now_us")

    def __init__(
        self, queries: dict[str, LiteralString], conn: sqlite3.Connection, now: int
    ) -> None:
        self._q = queries
        self.conn = conn
        self.now_us = now

    def fetch(self, name: str, params: dict[str, Any]) -> Result:
        sql = self._q[name]
        return _result(sql, self.conn.execute(sql, {"now": self.now_us, **params}))

    def fetch_each(self, name: str, params: Iterable[dict[str, Any]]) -> list[Result]:
        return [self.fetch(name, one) for one in params]

    def now(self) -> datetime:
        return from_micros(self.now_us)


def _refuse_transaction_control(action: int, *_args: object) -> int:
    """The authorizer a handler runs under (`SqliteConsumerTx.handler_scope`)."""
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_TRANSACTION else sqlite3.SQLITE_OK


class SqliteConsumerTx:
    def __init__(self, store: SqliteStore, conn: sqlite3.Connection) -> None:
        self._store = store
        self._conn = conn
        self._q = store._q

    def intent_claim(self, claims: Sequence[IntentClaim]) -> set[str]:
        if not claims:
            return set()
        payload = json.dumps([[c.key, c.task, c.job_id] for c in claims])
        rows = self._conn.execute(
            self._q["intent_claim"], {"claims": payload, "now": self._store._now()}
        ).fetchall()
        return {row[0] for row in rows}

    def intent_owners(self, keys: Sequence[str]) -> dict[str, int | None]:
        if not keys:
            return {}
        sql = self._q["intent_owner_list"]
        owners = _result(sql, self._conn.execute(sql, {"keys": json.dumps(list(keys))}))
        key, job_id = itemgetter("key", "job_id")(owners.columns())
        return {row[key]: row[job_id] for row in owners.rows}

    def intent_release(self, keys: Sequence[str]) -> None:
        if keys:
            self._conn.execute(self._q["intent_release"], {"keys": json.dumps(list(keys))})

    def handler_scope(self) -> AbstractContextManager[HandlerConnection]:
        return guard.handler_scope(
            self._conn,
            execute=self._execute_raw,
            transaction_status=self._status,
            protect=self._deny_transaction_statements,
        )

    def _status(self) -> str:
        return "ok" if self._conn.in_transaction else "gone"

    def _deny_transaction_statements(self) -> Callable[[], None]:
        """While a handler runs, SQLite itself refuses BEGIN/COMMIT/ROLLBACK (savepoints pass),
        however the statement reached it."""
        self._conn.set_authorizer(_refuse_transaction_control)
        return self._allow_transaction_statements

    def _allow_transaction_statements(self) -> None:
        self._conn.set_authorizer(None)

    def _execute_raw(self, sql: str) -> None:
        self._conn.execute(sql)

    def outbox_insert(self, rows: Sequence[OutboxInsert]) -> None:
        if rows:
            payload = json.dumps(
                [
                    (
                        r.key,
                        r.intent_key,
                        r.channel,
                        r.payload_json,
                        r.token,
                        r.job_id,
                        r.trace_context,
                    )
                    for r in rows
                ]
            )
            self._conn.execute(
                self._q["outbox_insert"], {"rows": payload, "now": self._store._now()}
            )

    def job_finish(self, token: str, finishes: Sequence[JobFinish]) -> set[int]:
        if not finishes:
            return set()
        now = self._store._now()
        payload = json.dumps([[f.id, f.state, f.outcome, _us(f.delay), f.error] for f in finishes])
        sql = self._q["job_finish"]
        settled = _result(
            sql, self._conn.execute(sql, {"rows": payload, "token": token, "now": now})
        )
        id_, attempt, worker, started, state, error = itemgetter(
            "id", "attempt", "leased_by", "leased_at", "state", "last_error"
        )(settled.columns())
        records = [
            [
                r[id_],
                r[attempt],
                r[worker],
                r[started],
                "dead" if r[state] == "dead" else "failed",
                r[error],
            ]
            for r in settled.rows
            if r[state] != "done"
        ]
        if records:
            self._conn.execute(
                self._q["job_finish__record"], {"rows": json.dumps(records), "now": now}
            )
        ids = [row[id_] for row in settled.rows]
        if ids:
            self._conn.execute(
                self._q["job_finish__count"], {"rows": payload, "settled": json.dumps(ids)}
            )
        return set(ids)

    def job_settle_relayed(self, finishes: Sequence[RelayedFinish]) -> set[int]:
        raise ConfigurationError(RELAY_NEEDS_POSTGRES)

    def counter_add(self, deltas: Mapping[str, int]) -> None:
        if any(deltas.values()):
            params = {"deltas": json.dumps(dict(sorted(deltas.items())))}
            self._conn.execute(self._q["counter_add"], params)


class SqliteConsumerSession:
    """One consumer thread's connection. SQLite never raises `ClaimLockTimeout`: a consumer
    transaction holds the database's only write lock, so no other claim can be in flight."""

    dialect = "sqlite"

    def __init__(self, store: SqliteStore, conn: sqlite3.Connection) -> None:
        self._store = store
        self._conn = conn
        self._q = store._q
        self._due: DueTime | None = None

    def job_lease(self, params: JobLeaseParams) -> list[LeasedJob]:
        values = {
            "tasks": json.dumps(list(params.tasks)),
            "queues": json.dumps(list(params.queues)),
            "limit": params.limit,
            "worker": params.worker,
            "token": params.token,
            "lease_us": _us(params.lease_for),
            "slots": params.slots,
        }
        plan = params.limits
        lease = self._store._write(self._conn, greedy=True)
        with self._store.metrics.timed("job_lease"), lease as conn:
            values["now"] = self._store._now()  # read under the write lock, not before it
            if plan and any(task in plan.tasks for task in params.tasks):
                return self._lease_limited(conn, values, plan)
            leased = _result(self._q["job_lease"], conn.execute(self._q["job_lease"], values))
            if len(leased.rows) < params.limit:  # running dry: when is the next one due?
                sql = self._q["job_next_due"]
                self._due = _result(sql, conn.execute(sql, values)).record(DueTime, _dt)
        return self._store._leased_jobs(leased)

    def _lease_limited(
        self, conn: sqlite3.Connection, values: dict[str, Any], plan: LimitPlan
    ) -> list[LeasedJob]:
        """As PostgreSQL's (`store/allocation.py`), under the write lock this lease holds."""
        q, store = self._q, self._store

        def run(name: str, params: dict[str, Any]) -> Result:
            return _result(q[name], conn.execute(q[name], params))

        limited, free = limited_lease.split(plan, json.loads(values["tasks"]))
        plan = plan.only(limited)
        survey_values = {
            name: json.dumps(value)
            for name, value in limited_lease.survey_params(plan, limited).items()
        }
        survey_values["now"] = now = values["now"]
        reads = [run(name, survey_values) for name in SURVEY]
        survey = limited_lease.survey_of(from_micros(now), reads, _dt)
        room = allocation.rooms(plan, survey)
        slots = values.pop("slots")
        wanted = allocation.asks(plan, survey, room, values["limit"], slots=slots)
        candidates: list[allocation.Candidate] = []
        for ask in wanted:
            asked = {"task": ask.task, "partition": ask.partition, "n": ask.count}
            asked.update(queues=values["queues"], now=now)
            found = run("job_limited_candidates", asked)
            candidates += limited_lease.candidates_of(found, _dt)
        choice = allocation.choose(plan, survey, room, candidates, values["limit"], slots=slots)
        jobs = []
        if choice.picks:
            took = run("job_lease_limited", {**values, "picks": limited_lease.picks_json(choice)})
            jobs = store._leased_jobs(took)
        if choice.spends:
            spends = limited_lease.spends_json(choice.spends, to_micros)
            run("limit_spend", {"spends": spends, "token": values["token"]})
        rest = values["limit"] - len(jobs)
        times = [choice.next_at]
        if rest > 0:  # every task's jobs without a partition (PostgreSQL's `_lease_limited`)
            jobs += store._leased_jobs(run("job_lease", {**values, "limit": rest}))
            if free:
                due = run("job_next_due", {**values, "tasks": json.dumps(free)})
                times.append(_dt(due.first("at")))
        if len(jobs) < values["limit"]:
            at = min((t for t in times if t is not None), default=None)
            self._due = DueTime(at, survey.now)
        return jobs

    def due_seen(self) -> DueTime | None:
        """Read in the lease's own transaction when it came back short: an idle poll is one
        transaction, as on PostgreSQL."""
        due, self._due = self._due, None
        return due

    def job_release(self, params: JobReleaseParams) -> int:
        values = {
            "jobs": json.dumps([list(job) for job in params.jobs]),
            "token": params.token,
            "delay_us": _us(params.delay),
        }
        with self._store.metrics.timed("job_release"), self._store._write(self._conn) as conn:
            values["now"] = self._store._now()
            return len(conn.execute(self._q["job_release"], values).fetchall())

    @contextmanager
    def transaction(self) -> Iterator[SqliteConsumerTx]:
        try:
            write = self._store._write(self._conn, greedy=True)
            with self._store.metrics.timed("consumer_transaction"), write:
                yield SqliteConsumerTx(self._store, self._conn)
        except (sqlite3.IntegrityError, sqlite3.DataError) as exc:
            raise StoreRefused(
                f"the database refused the transaction: {type(exc).__name__}: {exc}"
            ) from None

    def close(self) -> None:
        self._conn.close()
