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

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal

from oncebox import clock
from oncebox.clock import ClockFile, ClockSetting, from_micros, to_micros
from oncebox.errors import ConfigurationError, SchemaError, StoreRefused, StoreUnavailable
from oncebox.metrics import Metrics, operation
from oncebox.store import guard
from oncebox.store.base import (
    ActionResult,
    Audit,
    BucketSpec,
    BucketState,
    ConsumerSettings,
    DueTime,
    EnqueueConflict,
    HandlerConnection,
    InsertManyResult,
    IntentClaim,
    JobFinish,
    JobInsert,
    JobInsertMany,
    JobLeaseParams,
    JobReleaseParams,
    KeyCanary,
    LeasedJob,
    OperatorAction,
    OutboxFinish,
    OutboxInsert,
    OutboxLeased,
    OutboxLeaseParams,
    OutboxRow,
    RescuedJob,
    ScheduleRunClaim,
    ScheduleState,
    SchemaStatus,
    T,
    WorkerBeat,
    insert_chunks,
)
from oncebox.store.migrations import split_sqlite_script
from oncebox.store.reads import ReadOperations
from oncebox.store.rows import Result
from oncebox.store.sqlfiles import load_migrations, load_queries

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
    return Result(sql, cursor.fetchall(), lambda: [d[0] for d in cursor.description])


def _translate(exc: sqlite3.Error, where: Path) -> Exception:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreUnavailable(
            f"the SQLite database {where} stayed locked by another writer past the busy "
            f"timeout ({text}); nothing was written"
        )
    if "unable to open" in text or "disk I/O" in text or "readonly" in text:
        return StoreUnavailable(f"cannot write the SQLite database {where}: {text}")
    if "no such table: oncebox_" in text:
        return SchemaError(
            f"the oncebox tables are missing in {where} ({text}): run `oncebox migrate`"
        )
    return exc


class SqliteStore(ReadOperations):
    """See the module docstring. Open with `open_store("sqlite:///path.db")`."""

    dialect: Literal["sqlite"] = "sqlite"
    supports_notifications = True  # by watching the database files: see `wait_for_jobs`

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
        self._wal = Path(f"{path}-wal")
        self._q = load_queries("sqlite")
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        if not path.parent.exists():
            raise ConfigurationError(f"the directory of the SQLite database {path} does not exist")
        if migrate:
            self.schema_migrate()
        self._opened = self._files_state()  # a commit from now on wakes `wait_for_jobs`
        self._watchers = threading.local()  # each listener's last look (a box can run several)

    # -- connections ---------------------------------------------------------------------------

    def connect(self) -> sqlite3.Connection:
        """A new connection with oncebox's pragmas and `oncebox_now()` registered."""
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout.total_seconds(),
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(
                f"PRAGMA busy_timeout={int(self.busy_timeout / timedelta(milliseconds=1))}"
            )
            conn.create_function("oncebox_now", 0, self.clock_file.now_micros)
        except sqlite3.Error as exc:
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
    def _write(self, conn: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        conn = conn or self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None
        try:
            yield conn
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

    def _instant(self, value: Any) -> datetime | None:
        return _dt(value)

    def _set(self, values: Sequence[Any]) -> str:
        return json.dumps(list(values))

    def _fetch(self, name: str, params: dict[str, Any]) -> Result:
        """A read; `:now` is bound for the queries that compare with the clock."""
        sql = self._q[name]
        try:
            return _result(sql, self._conn().execute(sql, {"now": self._now(), **params}))
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    # -- schema --------------------------------------------------------------------------------

    def schema_status(self) -> SchemaStatus:
        known = tuple(m.version for m in load_migrations("sqlite"))
        conn = self._conn()
        conn.execute(self._q["migration_table_create"])
        listed = _result(self._q["migration_list"], conn.execute(self._q["migration_list"]))
        version = listed.columns()["version"]
        return SchemaStatus(applied=tuple(row[version] for row in listed.rows), known=known)

    @operation
    def schema_migrate(self) -> list[int]:
        applied_now: list[int] = []
        with self._write() as conn:
            conn.execute(self._q["migration_table_create"])
            listed = _result(self._q["migration_list"], conn.execute(self._q["migration_list"]))
            version = listed.columns()["version"]
            applied = {row[version] for row in listed.rows}
            for migration in load_migrations("sqlite"):
                if migration.version in applied:
                    continue
                try:
                    for statement in split_sqlite_script(migration.sql):
                        conn.execute(statement)
                except sqlite3.Error as exc:
                    raise SchemaError(
                        f"migration {migration.version} ({migration.name}) failed on "
                        f"{self.path}: {exc}; nothing of it was applied"
                    ) from None
                conn.execute(
                    self._q["migration_record"],
                    {
                        "version": migration.version,
                        "name": migration.name,
                        "checksum": migration.checksum,
                        "now": self._now(),
                    },
                )
                applied_now.append(migration.version)
        return applied_now

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
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                f"connection= must be a sqlite3.Connection for a SQLite box, not "
                f"{type(connection).__name__}"
            )
        files = [row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"]
        if not files or Path(files[0]).resolve() != self.path.resolve():
            raise ConfigurationError(
                f"connection= is open on {files[0] if files else 'an unnamed database'}, not on "
                f"this box's database {self.path}; the job would be written elsewhere"
            )
        return connection

    def _insert_params(self, job: JobInsert) -> dict[str, Any]:
        return {
            "key": job.key,
            "task": job.task,
            "queue": job.queue,
            "args": job.args_json,
            "priority": job.priority,
            "group_key": job.group_key,
            "max_attempts": job.max_attempts,
            "run_at": None if job.run_at is None else to_micros(job.run_at),
            "delay_us": _us(job.delay),
            "max_age_us": _us(job.max_age),
            "now": self._now(),
        }

    @operation
    def job_insert(self, job: JobInsert, connection: object | None = None) -> tuple[int, bool]:
        params = self._insert_params(job)
        try:
            if connection is not None:
                row = self._external(connection).execute(self._q["job_insert"], params).fetchone()
            else:
                with self._write() as conn:
                    params["now"] = self._now()  # read under the write lock, not before it
                    row = conn.execute(self._q["job_insert"], params).fetchone()
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from None
        return (int(row[0]), True) if row else (0, False)  # RETURNING id, state

    @operation
    def job_insert_many(self, jobs: JobInsertMany) -> InsertManyResult:
        params = {
            "task": jobs.task,
            "queue": jobs.queue,
            "priority": jobs.priority,
            "max_attempts": jobs.max_attempts,
            "schedule": None if jobs.for_run is None else jobs.for_run.schedule,
            "period": None if jobs.for_run is None else jobs.for_run.period,
            "run_at": None if jobs.run_at is None else to_micros(jobs.run_at),
            "delay_us": _us(jobs.delay),
            "max_age_us": _us(jobs.max_age),
            "now": self._now(),
        }
        created: list[tuple[int, str | None]] = []
        offered = 0
        sql = self._q["job_insert_many"]
        # checked and encoded before the write lock: one writer at a time, so no overlap to win,
        # and every other writer would wait on the caller's rows
        chunks = list(insert_chunks(jobs.rows, INSERT_CHUNK, INSERT_CHUNK_CHARS))
        with self._write() as conn:
            params["now"] = self._now()
            for chunk in chunks:
                offered += len(chunk)
                params["rows"] = json.dumps(chunk)
                inserted = _result(sql, conn.execute(sql, params))
                id_, key = itemgetter("id", "key")(inserted.columns())
                created += [(int(r[id_]), r[key]) for r in inserted.rows]
            held = True
            if jobs.for_run is not None:
                run = jobs.for_run
                held = (
                    conn.execute(
                        self._q["schedule_run_extend"],
                        {
                            "schedule": run.schedule,
                            "period": run.period,
                            "owner": run.owner,
                            "lease_us": _us(run.lease_for),
                            "enqueued": len(created),
                            "now": params["now"],
                        },
                    ).fetchone()
                    is not None
                )
        return InsertManyResult(created, offered, held)

    @operation
    def job_enqueue_conflict(self, key: str, connection: object | None = None) -> EnqueueConflict:
        conn = self._external(connection) if connection is not None else self._conn()
        sql = self._q["job_enqueue_conflict"]
        found = _result(sql, conn.execute(sql, {"key": key})).record(EnqueueConflict, _dt)
        assert found is not None  # one row, always
        return found

    # -- leases --------------------------------------------------------------------------------

    @operation
    def job_lease_extend(self, tokens: Sequence[str], lease_for: timedelta) -> int:
        with self._write() as conn:
            cursor = conn.execute(
                self._q["job_lease_extend"],
                {
                    "tokens": json.dumps(list(tokens)),
                    "lease_us": _us(lease_for),
                    "now": self._now(),
                },
            )
            return cursor.rowcount

    @operation
    def job_rescue_expired(self, limit: int) -> list[RescuedJob]:
        with self._write() as conn:
            now = self._now()
            sql = self._q["job_rescue_expired"]
            rescued = _result(sql, conn.execute(sql, {"limit": limit, "now": now}))
            if rescued.rows:
                fields = ("id", "attempt", "worker", "leased_at", "last_error")
                record = itemgetter(*itemgetter(*fields)(rescued.columns()))
                conn.execute(
                    self._q["job_rescue_expired__record"],
                    {"rows": json.dumps([record(r) for r in rescued.rows]), "now": now},
                )
        return rescued.records(RescuedJob, _dt)

    @operation
    def job_attempt_note(self, job_id: int, attempt: int, worker: str, note: str) -> None:
        with self._write() as conn:
            conn.execute(
                self._q["job_attempt_note"],
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "worker": worker,
                    "note": note,
                    "now": self._now(),
                },
            )

    # -- operator actions ----------------------------------------------------------------------

    def _action(self, name: str, action: OperatorAction) -> ActionResult | None:
        with self._write() as conn:
            now = self._now()
            acted = _result(
                self._q[name], conn.execute(self._q[name], {"id": action.job_id, "now": now})
            )
            if not acted.rows:
                return None
            row = dict(zip(acted.columns(), acted.rows[0], strict=True))
            params = {
                "attempt": None,
                **row,
                "actor": action.actor,
                "reason": action.reason,
                "now": now,
            }
            audit = conn.execute(self._q[f"{name}__audit"], params).fetchone()
        return ActionResult(job_id=row["id"], key=row["key"], audit_id=audit[0])

    @operation
    def job_replay(self, action: OperatorAction) -> ActionResult | None:
        return self._action("job_replay", action)

    @operation
    def job_cancel(self, action: OperatorAction) -> ActionResult | None:
        return self._action("job_cancel", action)

    # -- reads ---------------------------------------------------------------------------------

    @operation
    def job_next_due(self, tasks: Sequence[str], queues: Sequence[str]) -> DueTime:
        due = self._record(
            DueTime, "job_next_due", {"tasks": self._set(tasks), "queues": self._set(queues)}
        )
        assert due is not None  # one row, always
        return due

    @operation
    def outbox_next_due(self, channels: Sequence[str]) -> DueTime:
        due = self._record(DueTime, "outbox_next_due", {"channels": self._set(channels)})
        assert due is not None  # one row, always
        return due

    @operation
    def job_prune(self, older_than: timedelta, limit: int) -> int:
        with self._write() as conn:
            ids = [
                r[0]  # RETURNING id
                for r in conn.execute(
                    self._q["job_prune"],
                    {"older_than_us": _us(older_than), "limit": limit, "now": self._now()},
                )
            ]
            if ids:
                conn.execute(self._q["job_prune__attempts"], {"ids": json.dumps(ids)})
        return len(ids)

    @operation
    def intent_prune(self, task: str, older_than: timedelta, limit: int) -> int:
        with self._write() as conn:
            params = {
                "task": task,
                "older_than_us": _us(older_than),
                "limit": limit,
                "now": self._now(),
            }
            return len(conn.execute(self._q["intent_prune"], params).fetchall())

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
    def outbox_mark_sending(self, outbox_id: int, token: str) -> bool:
        with self._write() as conn:
            params = {"id": outbox_id, "token": token}
            return conn.execute(self._q["outbox_mark_sending"], params).fetchone() is not None

    @operation
    def outbox_finish(self, token: str, finishes: Sequence[OutboxFinish]) -> set[int]:
        if not finishes:
            return set()
        with self._write() as conn:
            return self._outbox_finish_in(conn, token, finishes)

    def _outbox_finish_in(
        self, conn: sqlite3.Connection, token: str, finishes: Sequence[OutboxFinish]
    ) -> set[int]:
        now = self._now()
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
        return {row[id_] for row in settled.rows}

    @operation
    def outbox_rescue_expired(
        self,
        channels: Sequence[str],
        limit: int,
        decide: Callable[[list[OutboxRow], datetime], list[OutboxFinish]],
    ) -> list[OutboxFinish]:
        applied: list[OutboxFinish] = []
        with self._write() as conn:
            now = self._now()
            sql = self._q["outbox_rescue_select"]
            params = {"limit": limit, "now": now, "channels": self._set(channels)}
            rows = _result(sql, conn.execute(sql, params)).records(OutboxRow, _dt)
            tokens = {row.id: row.lease_token for row in rows}
            for finish in decide(rows, from_micros(now)):
                token = tokens.get(finish.id)
                if token is not None and self._outbox_finish_in(conn, token, [finish]):
                    applied.append(finish)
        return applied

    def _audited(self, name: str, params: dict[str, Any]) -> ActionResult | None:
        """An operator action and its audit row, in one transaction (`name`, `name__audit`)."""
        with self._write() as conn:
            now = self._now()
            acted = _result(self._q[name], conn.execute(self._q[name], {**params, "now": now}))
            if not acted.rows:
                return None
            row = dict(zip(acted.columns(), acted.rows[0], strict=True))
            audit = conn.execute(
                self._q[f"{name}__audit"], {**params, **row, "now": now}
            ).fetchone()
        return ActionResult(job_id=row["id"], key=row["key"], audit_id=audit[0])

    @operation
    def outbox_resolve(
        self, action: OperatorAction, resolution: Literal["sent", "resend"], receipt: str | None
    ) -> ActionResult | None:
        params = {
            "id": action.job_id,
            "actor": action.actor,
            "reason": action.reason,
            "resolution": resolution,
            "receipt": receipt,
        }
        return self._audited("outbox_resolve", params)

    @operation
    def outbox_replay(self, action: OperatorAction) -> ActionResult | None:
        params = {"id": action.job_id, "actor": action.actor, "reason": action.reason}
        return self._audited("outbox_replay", params)

    @operation
    def rate_bucket_configure(self, channel: str, specs: Sequence[BucketSpec]) -> None:
        buckets = json.dumps([[b.name, b.capacity, b.refill_per_s] for b in specs])
        with self._write() as conn:
            conn.execute(
                self._q["rate_bucket_configure"],
                {"channel": channel, "buckets": buckets, "now": self._now()},
            )

    @operation
    def rate_bucket_apply(
        self,
        channel: str,
        names: Sequence[str],
        decide: Callable[
            [list[BucketState], datetime, datetime | None], tuple[list[BucketState], T]
        ],
    ) -> T:
        with self._write() as conn:
            now = self._now()
            params = {"channel": channel, "names": json.dumps(list(names)), "now": now}
            sql = self._q["rate_bucket_select"]
            found = _result(sql, conn.execute(sql, params))
            if not found.rows:
                sql = self._q["channel_pause_read"]
                found = _result(sql, conn.execute(sql, params))
                buckets = []
            else:
                buckets = found.records(BucketState, _dt)
            paused = found.rows[0][found.columns()["paused_until"]]
            after, result = decide(buckets, from_micros(now), _dt(paused))
            if after:
                conn.execute(
                    self._q["rate_bucket_update"],
                    {
                        "channel": channel,
                        "buckets": json.dumps(
                            [[b.name, b.tokens, to_micros(b.updated_at)] for b in after]
                        ),
                    },
                )
        return result

    @operation
    def channel_pause(self, channel: str, pause_for: timedelta, reason: str) -> datetime:
        with self._write() as conn:
            row = conn.execute(
                self._q["channel_pause"],
                {
                    "channel": channel,
                    "pause_us": _us(pause_for),
                    "reason": reason,
                    "now": self._now(),
                },
            ).fetchone()
        return from_micros(row[0])  # RETURNING paused_until

    @operation
    def setting_put_if_absent(self, name: str, value: str) -> str:
        with self._write() as conn:
            conn.execute(self._q["setting_put_if_absent"], {"name": name, "value": value})
            row = conn.execute(self._q["setting_get"], {"name": name}).fetchone()
        return str(row[0])

    # -- the key-drift guard ---------------------------------------------------------------------

    @operation
    def key_canary_record(self, canary: KeyCanary) -> KeyCanary:
        with self._write() as conn:
            conn.execute(
                self._q["key_canary_record"], {**_canary_params(canary), "now": self._now()}
            )
        stored = self.key_canary_get(canary.kind, canary.name)
        assert stored is not None
        return stored

    @operation
    def key_canary_accept(self, canary: KeyCanary, actor: str, reason: str) -> int:
        with self._write() as conn:
            sql = self._q["key_canary_get"]
            found = _result(sql, conn.execute(sql, {"kind": canary.kind, "name": canary.name}))
            source, outputs = itemgetter("source", "outputs")(found.columns())
            previous = found.rows[0] if found.rows else None
            params = {
                **_canary_params(canary),
                "actor": actor,
                "reason": reason,
                "now": self._now(),
                "was": previous[source] if previous else None,
                "was_outputs": previous[outputs] if previous else None,
            }
            conn.execute(self._q["key_canary_accept"], params)
            audit = conn.execute(self._q["key_canary_accept__audit"], params).fetchone()
            return int(audit[0])  # RETURNING id

    # -- schedules -----------------------------------------------------------------------------

    @operation
    def schedule_state(self, name: str, grace: timedelta) -> ScheduleState:
        state = self._record(ScheduleState, "schedule_state_get", {"name": name})
        if state is None:
            with self._write() as conn:
                conn.execute(
                    self._q["schedule_state_init"],
                    {"name": name, "grace_us": _us(grace), "now": self._now()},
                )
            state = self._record(ScheduleState, "schedule_state_get", {"name": name})
        assert state is not None
        return state

    @operation
    def schedule_state_advance(self, name: str, at: datetime) -> None:
        with self._write() as conn:
            conn.execute(
                self._q["schedule_state_advance"],
                {"name": name, "at": to_micros(at), "now": self._now()},
            )

    @operation
    def schedule_state_pause(self, name: str, paused: bool, audit: Audit | None = None) -> None:
        with self._write() as conn:
            params = {"name": name, "paused": int(paused), "now": self._now()}
            conn.execute(self._q["schedule_state_pause"], params)
            if audit is not None:
                conn.execute(
                    self._q["schedule_state_pause__audit"],
                    {**params, "actor": audit.actor, "reason": audit.reason},
                )

    @operation
    def schedule_run_claim(self, claim: ScheduleRunClaim) -> bool:
        params = {
            "schedule": claim.schedule,
            "period": claim.period,
            "fire_at": None if claim.fire_at is None else to_micros(claim.fire_at),
            "owner": claim.owner,
            "lease_us": _us(claim.lease_for),
            "late": int(claim.late),
            "rescan": int(claim.rescan),
        }
        with self._write() as conn:
            params["now"] = self._now()
            return conn.execute(self._q["schedule_run_claim"], params).fetchone() is not None

    @operation
    def schedule_run_extend(
        self, schedule: str, period: str, owner: str, lease_for: timedelta, enqueued: int
    ) -> bool:
        with self._write() as conn:
            row = conn.execute(
                self._q["schedule_run_extend"],
                {
                    "schedule": schedule,
                    "period": period,
                    "owner": owner,
                    "lease_us": _us(lease_for),
                    "enqueued": enqueued,
                    "now": self._now(),
                },
            ).fetchone()
        return row is not None

    @operation
    def schedule_run_finish(
        self, schedule: str, period: str, owner: str, eligible: int, enqueued: int
    ) -> bool:
        with self._write() as conn:
            row = conn.execute(
                self._q["schedule_run_finish"],
                {
                    "schedule": schedule,
                    "period": period,
                    "owner": owner,
                    "eligible": eligible,
                    "enqueued": enqueued,
                    "now": self._now(),
                },
            ).fetchone()
        return row is not None

    # -- lanes ---------------------------------------------------------------------------------

    # -- workers -------------------------------------------------------------------------------

    @operation
    def worker_beat(self, beat: WorkerBeat) -> None:
        params = {
            "name": beat.name,
            "host": beat.host,
            "pid": beat.pid,
            "tasks": json.dumps(list(beat.tasks)),
            "queues": json.dumps(list(beat.queues)),
            "channels": json.dumps(list(beat.channels)),
            "now": self._now(),
        }
        with self._write() as conn:
            conn.execute(self._q["worker_beat"], params)
            conn.execute(self._q["worker_beat__forget"], {"now": params["now"]})

    @operation
    def worker_stop(self, name: str) -> None:
        with self._write() as conn:
            conn.execute(self._q["worker_stop"], {"name": name, "now": self._now()})

    def _live_params(self, live_within: timedelta) -> dict[str, Any]:
        return {"live_us": _us(live_within)}

    def consumer_session(self, settings: ConsumerSettings) -> SqliteConsumerSession:
        return SqliteConsumerSession(self, self.connect())

    def wait_for_jobs(self, timeout: float) -> bool:
        """Wait for a commit by any process. SQLite has no notifications, but every commit writes
        the database files — the write-ahead log, or the database itself when the log is
        checkpointed — so a change of their size, modification time or inode, seen with a `stat`
        every `WATCH_EVERY` seconds, wakes an idle worker without a query. Each calling thread
        compares with its own last look, from the state when the store was opened. A change it
        cannot see (a filesystem with coarse timestamps, where a rewritten log can keep its size)
        still reaches the lanes by their poll interval."""
        deadline = clock.monotonic() + timeout
        seen = getattr(self._watchers, "state", self._opened)
        while True:
            state = self._files_state()
            if state != seen:
                self._watchers.state = state
                return True
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                self._watchers.state = state
                return False
            clock.sleep(min(WATCH_EVERY, remaining))

    def _files_state(self) -> tuple[tuple[int, int, int] | None, ...]:
        def state(path: Path) -> tuple[int, int, int] | None:
            try:
                found = path.stat()
            except OSError:  # not there (yet), or not readable: nothing to compare, the poll covers
                return None
            return found.st_ino, found.st_mtime_ns, found.st_size

        return state(self.path), state(self._wal)

    def notify_jobs(self) -> None:
        """Nothing to send: the commit that made rows ready changed the files (see
        `wait_for_jobs`)."""


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
            transaction_status=lambda: "ok" if self._conn.in_transaction else "gone",
            protect=self._deny_transaction_statements,
        )

    def _deny_transaction_statements(self) -> Callable[[], None]:
        """While a handler runs, SQLite itself refuses BEGIN/COMMIT/ROLLBACK (savepoints pass),
        however the statement reached it."""

        def authorize(action: int, *_args: object) -> int:
            return (
                sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_TRANSACTION else sqlite3.SQLITE_OK
            )

        self._conn.set_authorizer(authorize)
        return lambda: self._conn.set_authorizer(None)

    def _execute_raw(self, sql: str) -> None:
        self._conn.execute(sql)

    def outbox_insert(self, rows: Sequence[OutboxInsert]) -> None:
        if rows:
            payload = json.dumps(
                [[r.key, r.intent_key, r.channel, r.payload_json, r.token, r.job_id] for r in rows]
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
        return {row[id_] for row in settled.rows}


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
        }
        with self._store.metrics.timed("job_lease"), self._store._write(self._conn) as conn:
            values["now"] = self._store._now()  # read under the write lock, not before it
            leased = _result(self._q["job_lease"], conn.execute(self._q["job_lease"], values))
            if len(leased.rows) < params.limit:  # running dry: when is the next one due?
                sql = self._q["job_next_due"]
                self._due = _result(sql, conn.execute(sql, values)).record(DueTime, _dt)
        return self._store._leased_jobs(leased)

    def due_seen(self) -> DueTime | None:
        """Read in the lease's own transaction when it came back short: an idle poll is one
        transaction, as on PostgreSQL."""
        due, self._due = self._due, None
        return due

    def job_release(self, params: JobReleaseParams) -> int:
        values = {
            "ids": json.dumps(list(params.ids)),
            "token": params.token,
            "delay_us": _us(params.delay),
        }
        with self._store.metrics.timed("job_release"), self._store._write(self._conn) as conn:
            values["now"] = self._store._now()
            return len(conn.execute(self._q["job_release"], values).fetchall())

    @contextmanager
    def transaction(self) -> Iterator[SqliteConsumerTx]:
        try:
            with self._store.metrics.timed("consumer_transaction"), self._store._write(self._conn):
                yield SqliteConsumerTx(self._store, self._conn)
        except (sqlite3.IntegrityError, sqlite3.DataError) as exc:
            raise StoreRefused(
                f"the database refused the transaction: {type(exc).__name__}: {exc}"
            ) from None

    def close(self) -> None:
        self._conn.close()


def _canary_params(canary: KeyCanary) -> dict[str, Any]:
    return {
        "kind": canary.kind,
        "name": canary.name,
        "source": canary.source,
        "outputs": json.dumps(list(canary.outputs)),
    }
