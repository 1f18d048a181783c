"""The PostgreSQL store: production, many workers on many hosts.

Concurrency comes from the database: claims use `FOR UPDATE SKIP LOCKED`, the intent is a unique
index (whose enforcement does not depend on the isolation level), and every completing update is
fenced on the lease token. Time is the server's (`oncebox_now()`), so hosts' clocks do not matter.

Connections: a `psycopg_pool` pool (autocommit; an operation that needs several statements opens
its own transaction) serves short operations; each consumer thread has a dedicated connection
whose session settings bound claim waits (`lock_timeout`) and hung handlers
(`idle_in_transaction_session_timeout`, `statement_timeout`); the listener has one more, for
LISTEN. The schema is `public` unless the URL says `?schema=name`; it must be migrated explicitly
(`oncebox migrate`).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, Literal, LiteralString, cast
from urllib.parse import unquote

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from oncebox.kernel.clock import ClockSetting, process_owner
from oncebox.kernel.errors import ConfigurationError, SchemaError, StoreRefused, StoreUnavailable
from oncebox.kernel.inert import printable, redact, scrubbed
from oncebox.kernel.metrics import Metrics, operation
from oncebox.store import allocation, forks, guard
from oncebox.store import limited as limited_lease
from oncebox.store.caller import LoopConnection, driver_connection
from oncebox.store.limited import SURVEY
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
    RelayedFinish,
    WorkerBeat,
    WorkKind,
    insert_chunks,
)
from oncebox.store.protocol import ClaimLockTimeout, HandlerConnection, T
from oncebox.store.pruning import PruneOperations
from oncebox.store.records import (
    HISTORY_WAITING_CAP,
    ActionResult,
    BucketState,
    DueTime,
    HistoryTended,
    LeasedJob,
    OutboxLeased,
    RescuedJob,
    ScheduleRunTakeOver,
    SchemaStatus,
)
from oncebox.store.rows import Result
from oncebox.store.sqlfiles import Migration, load_migrations, load_queries
from oncebox.store.writes import WriteOperations, beat_params, canary_params

INSERT_CHUNK = 5000
INSERT_CHUNK_CHARS = 16 * 1024 * 1024
_OPTIONS = {"schema", "pool_min", "pool_max", "connect_timeout", "prepare_threshold"}
# what a transaction-mode pooler (PgBouncer) does to psycopg's automatic prepared statements: a
# statement prepared on one server connection is missing on the next, or one of the same name
# prepared by another client is already there
_POOLER_PREPARED = (pg_errors.DuplicatePreparedStatement, pg_errors.InvalidSqlStatementName)
# the NOTIFY channels of migration 0012 (before it, outbox rows notified on the jobs' channel)
_CHANNEL_KIND: dict[str, WorkKind] = {"oncebox_jobs": "jobs", "oncebox_outbox": "outbox"}


# Sets of rows go to the server as one JSON array in one text parameter, parsed there once:
# psycopg dumps a Python list into an array literal element by element in Python, quoting and
# escaping every text (a JSON payload's quotes one by one) — 10-20 µs per row of a batch. JSON
# already held as text (job arguments, outbox payloads) is spliced in as it is.
_text = json.encoder.encode_basestring_ascii  # the C encoder of one JSON string


class _Json(str):
    """Text that is already JSON (job arguments, an outbox payload): spliced in as it is."""


_Cell = str | int | float | bool | None


def _cell(value: _Cell) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _Json):
        return value
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, float):
        if not math.isfinite(value):  # delays only, always finite: NaN would not be JSON
            raise ValueError(f"{value!r} cannot be sent as JSON")
        return float.__repr__(value)
    return int.__repr__(value)  # an IntEnum's own repr would not be JSON


def _json_rows(rows: Iterable[Iterable[_Cell]]) -> str:
    """Rows as one JSON array of arrays, without `json.dumps`'s per-call set-up."""
    return "[" + ",".join("[" + ",".join(map(_cell, row)) + "]" for row in rows) + "]"


# The consumer's own sets, one row per job of a batch, each written by one format string: the
# same text as `_json_rows` gives their cells (a test pins each to it), without `_cell`'s type
# tests per cell — 1.5-2 µs per row of a batch.


def _text_or_null(value: str | None) -> str:
    return "null" if value is None else _text(value)


def _int_or_null(value: int | None) -> str:
    return "null" if value is None else int.__repr__(value)


def _claim_rows(claims: Sequence[IntentClaim]) -> str:
    """`intent_claim`'s input: (key, task, job id) per claim."""
    rows = [f"[{_text(c.key)},{_text(c.task)},{_int_or_null(c.job_id)}]" for c in claims]
    return "[" + ",".join(rows) + "]"


def _finish_rows(finishes: Sequence[JobFinish]) -> str:
    """`job_finish`'s input: (id, state, outcome, delay in seconds, error) per job."""
    rows = [
        f"[{int.__repr__(f.id)},{_text(f.state)},{_text_or_null(f.outcome)},"
        f"{float.__repr__(f.delay.total_seconds())},{_text_or_null(f.error)}]"
        for f in finishes
    ]
    return "[" + ",".join(rows) + "]"


def _outbox_rows(rows: Sequence[OutboxInsert]) -> str:
    """`outbox_insert`'s input: (key, intent key, channel, payload, token, job id, trace
    context) per row; the payload, JSON already, spliced in as it is."""
    cells = [
        f"[{_text(r.key)},{_text(r.intent_key)},{_text(r.channel)},{r.payload_json},"
        f"{_text(r.token)},{_int_or_null(r.job_id)},{_text_or_null(r.trace_context)}]"
        for r in rows
    ]
    return "[" + ",".join(cells) + "]"


def _relayed_rows(finishes: Sequence[RelayedFinish]) -> str:
    """`job_settle_relayed`'s input: one row per job a broker delivered (or gave up on)."""
    return _json_rows(
        (
            f.id,
            f.run,
            f.state,
            f.outcome,
            f.delay.total_seconds(),
            f.error,
            f.worker,
            f.started_at.isoformat(),
        )
        for f in finishes
    )


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _required_utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _result(sql: str, cursor: psycopg.Cursor[Any]) -> Result:
    """A statement's rows, read by column name (`store/rows.py`)."""
    rows = cursor.fetchall()
    return Result(sql, rows, lambda: [c.name for c in cursor.description or ()], cursor.rowcount)


def _written(sql: str, cursor: psycopg.Cursor[Any]) -> Result:
    """`_result`, also for a statement that returns no rows (no RETURNING)."""
    found = cursor.pgresult
    if found is None or found.status != pq.ExecStatus.TUPLES_OK:
        return Result(sql, [], tuple, cursor.rowcount)
    return _result(sql, cursor)


def _seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """Separate oncebox's own URL options (schema, pool sizes) from what libpq receives, and
    refuse a URL libpq could not parse (ConfigurationError: a usage mistake, not an outage).

    The URL is cut as text, not rebuilt with `urlunsplit` — which drops the `//` of a host-less
    URL (`postgresql:///db`, the socket form) — and libpq's query parameters are passed on
    exactly as written (re-encoding them would turn `%20` into `+`, which libpq does not
    decode)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in {"postgres", "postgresql"}:
        raise ConfigurationError(f"{redact(url)} is not a postgresql:// URL")
    rest, hash_sign, fragment = rest.partition("#")
    base, _, query = rest.partition("?")
    ours: dict[str, str] = {}
    kept: list[str] = []
    for piece in query.split("&"):
        name, _, value = piece.partition("=")
        if unquote(name) in _OPTIONS:
            ours[unquote(name)] = unquote(value)
        elif piece:
            kept.append(piece)
    conninfo = f"postgresql://{base}" + ("?" + "&".join(kept) if kept else "")
    conninfo += hash_sign + fragment
    _check_conninfo(url, conninfo)
    return conninfo, ours


def _check_conninfo(url: str, conninfo: str) -> None:
    """What libpq would refuse only when connecting (or silently cut short), refused now: an
    unclosed `[`, an unknown parameter, a port that is not a number, a NUL."""
    shown = redact(url)
    shown = shown if len(shown) <= 120 else shown[:120] + "…"
    if "\x00" in conninfo:  # libpq would read the URL up to it and ignore the rest
        raise ConfigurationError(f"PostgreSQL URL '{shown}' is malformed: it contains a NUL")
    try:
        parsed = conninfo_to_dict(conninfo)
    except (psycopg.Error, ValueError) as exc:  # ValueError: a lone surrogate
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = detail.split(" in URI:")[0]  # libpq quotes the whole URL, password and all
        detail = printable(scrubbed(detail, url))[:200]
        raise ConfigurationError(f"PostgreSQL URL '{shown}' is malformed: {detail}") from None
    for port in str(parsed.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port[:6]) < 65536):
            raise ConfigurationError(
                f"PostgreSQL URL '{shown}' is malformed: port {scrubbed(port, url)[:20]!r} is "
                "not a number within 1..65535"
            )


MIGRATION_LOCK_TIMEOUT_MS = 10_000


@contextmanager
def one_round_trip(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A short transaction whose statements need nothing from each other's results (a lease
    and its settings): BEGIN, the statements and COMMIT go to the server together and come back
    with one Sync — one round trip. psycopg's `transaction()` inside a pipeline syncs at its end
    as well: an empty one cost 0.54 ms against 0.18 here, a lease 1.11 against 0.76. Results
    are read after the block. A statement that fails makes the server skip the rest, COMMIT
    included; the transaction it leaves is rolled back before the error goes on."""
    try:
        with conn.pipeline():
            conn.execute(b"BEGIN")
            yield
            conn.execute(b"COMMIT")
    except BaseException:
        roll_back_quietly(conn)
        raise


def roll_back_quietly(conn: psycopg.Connection[Any]) -> None:
    """Roll back what a failure left open; an error doing so gives way to the failure itself,
    which is on its way out and says more (a lost connection says so there too)."""
    if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()


class PostgresStore(WriteOperations["PostgresTx"], PruneOperations["PostgresTx"]):
    """See the module docstring. Open with `open_store("postgresql://host/db")`."""

    dialect: Literal["postgres"] = "postgres"
    supports_notifications = True
    keeps_history = True

    def __init__(self, url: str, *, metrics: Metrics | None = None) -> None:
        self.url = url
        self.where = redact(url)
        self.metrics = metrics or Metrics()
        self.conninfo, options = split_url(url)
        self.schema = options.get("schema", "public")
        try:
            self.pool_min = int(options.get("pool_min", "1"))
            self.pool_max = int(options.get("pool_max", "10"))
            self.connect_timeout = float(options.get("connect_timeout", "10"))
            if self.pool_min < 0 or self.pool_max < 1 or not 0 < self.connect_timeout < 1e6:
                raise ValueError
        except ValueError:
            raise ConfigurationError(
                f"pool_min, pool_max and connect_timeout in {self.where} must be numbers "
                "(pool_min 0 or more, pool_max 1 or more, connect_timeout above 0 seconds)"
            ) from None
        self._driver = self._driver_options(options.get("prepare_threshold"))
        self._q = load_queries("postgres", self.schema)
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()
        self._listener: psycopg.Connection[Any] | None = None
        # where handlers write through an ORM that configures its connections (Django's adapters
        # and cursors): the psycopg.connect() arguments it would use, for the consumers' own
        self.consumer_connect_params: Callable[[], dict[str, Any]] | None = None
        forks.watch(self)

    def _driver_options(self, threshold: str | None) -> dict[str, Any]:
        """psycopg's own connection options from the URL: `prepare_threshold=none` turns its
        automatic prepared statements off, which a transaction-mode pooler needs (PgBouncer
        before 1.21, or without `max_prepared_statements`)."""
        if threshold is None:
            return {}
        if threshold.lower() == "none":
            return {"prepare_threshold": None}
        if threshold.isascii() and threshold.isdigit() and len(threshold) <= 6:
            return {"prepare_threshold": int(threshold)}
        raise ConfigurationError(
            f"prepare_threshold={threshold[:40]!r} in {self.where} must be `none` (no prepared "
            "statements: behind PgBouncer in transaction pooling) or a number of executions"
        )

    def forget_inherited(self) -> list[object]:
        """After a fork, in the child: a pool and a listener of its own, opened when first
        needed (`store/forks.py`)."""
        inherited: list[object] = [c for c in (self._pool, self._listener) if c is not None]
        self._pool, self._listener = None, None
        self._pool_lock = threading.Lock()  # it may have been held by another thread at the fork
        return inherited

    # -- connections ---------------------------------------------------------------------------

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = printable(scrubbed(detail, self.url))
        return StoreUnavailable(f"PostgreSQL at {self.where} is unavailable: {detail}")

    def pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        with self._pool_lock:
            if self._pool is None:
                # One direct connection first: if the server is unreachable, fail at once with
                # libpq's reason, instead of the pool retrying (and logging) until its timeout.
                self.connect().close()
                pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
                    psycopg_pool.ConnectionPool(
                        self.conninfo,
                        min_size=self.pool_min,
                        max_size=max(self.pool_max, self.pool_min),
                        kwargs={
                            "autocommit": True,
                            **self._driver,
                            **self._named("oncebox pool"),
                        },
                        open=False,
                        name="oncebox",
                        timeout=self.connect_timeout,
                        reconnect_timeout=self.connect_timeout,
                    )
                )
                try:
                    pool.open(wait=True, timeout=self.connect_timeout)
                except psycopg_pool.PoolTimeout:
                    pool.close()
                    raise self._probe_failure() from None
                self._pool = pool
            return self._pool

    def _named(self, name: str) -> dict[str, str]:
        """An application_name for pg_stat_activity, unless the URL sets its own."""
        return {} if "application_name" in self.conninfo else {"application_name": name}

    def _probe_failure(self) -> StoreUnavailable:
        """Connect once directly, to say *why* the pool could not (the pool only times out)."""
        try:
            psycopg.connect(self.conninfo, connect_timeout=int(self.connect_timeout)).close()
        except psycopg.Error as exc:
            return self._unavailable(exc)
        return StoreUnavailable(f"PostgreSQL at {self.where} did not accept connections in time")

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self.pool().connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            if isinstance(exc, pg_errors.LockNotAvailable):
                raise
            raise self._unavailable(exc) from None
        except (
            pg_errors.UndefinedTable,
            pg_errors.UndefinedFunction,
            pg_errors.InvalidSchemaName,
        ) as exc:
            raise self._missing_tables(exc) from None
        except _POOLER_PREPARED as exc:
            detail = str(exc).strip().splitlines()[0]
            raise ConfigurationError(
                f"PostgreSQL at {self.where}: {detail} — a transaction-mode pooler (PgBouncer) "
                "between oncebox and PostgreSQL? add prepare_threshold=none to the URL"
            ) from None

    def _missing_tables(self, exc: Exception) -> SchemaError:
        detail = str(exc).strip().splitlines()[0]
        return SchemaError(
            f"the oncebox tables are missing in {self.where} ({detail}): run `oncebox migrate`"
        )

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A dedicated connection outside the pool (consumer sessions, the listener, tests)."""
        return self._open(
            conninfo=self.conninfo,
            connect_timeout=int(self.connect_timeout),
            **{**self._driver, **kwargs},
        )

    def _open(self, **arguments: Any) -> psycopg.Connection[Any]:
        """psycopg.connect, its failures said as this store says them."""
        try:
            return psycopg.connect(**arguments)
        except psycopg.Error as exc:
            if "unsupported startup parameter" in str(exc):
                raise self._behind_a_pooler(exc) from None
            raise self._unavailable(exc) from None

    def _behind_a_pooler(self, exc: psycopg.Error) -> ConfigurationError:
        """A worker's connection through a transaction-mode pooler: say what to do, once, not
        retry an outage that is not one."""
        said = str(exc).strip().splitlines()[-1]
        detail = printable(scrubbed(said.rpartition("FATAL:")[2].strip() or said, self.url))
        return ConfigurationError(
            f"PostgreSQL at {self.where} refused a worker connection's session bounds ({detail}):"
            " a transaction-mode pooler such as PgBouncer is in the way. Point workers straight at"
            " PostgreSQL or at a session-mode pool; web processes that only enqueue may stay"
            " behind it with prepare_threshold=none"
        )

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    # -- what the shared operations ask of PostgreSQL (store/reads.py, store/writes.py) --------

    def _instant(self, value: Any) -> datetime | None:
        return _utc(value)

    def _at(self, instant: datetime | None) -> datetime | None:
        return instant

    def _span(self, name: str, delta: timedelta | None) -> dict[str, Any]:
        return {f"{name}_s": _seconds(delta)}

    def _set(self, values: Sequence[Any]) -> list[Any]:
        return list(values)

    def _fetch(self, name: str, params: dict[str, Any], connection: object | None = None) -> Result:
        """One statement, on its own (the pool's connections commit each) or on the caller's
        `connection`."""
        sql = self._q[name]
        if connection is not None:
            return _written(sql, self._external(connection).execute(sql, params))
        with self._connection() as conn:
            return _written(sql, conn.execute(sql, params))

    @operation
    def job_bury_relayed(self, finishes: Sequence[RelayedFinish]) -> set[int]:
        if not finishes:
            return set()
        rows = self._apply("job_settle_relayed", {"finishes": _relayed_rows(finishes)}).rows
        return {row[0] for row in rows}

    def _apply(self, name: str, params: dict[str, Any], connection: object | None = None) -> Result:
        return self._fetch(name, params, connection)

    @contextmanager
    def _transaction(self) -> Iterator[PostgresTx]:
        with self._connection() as conn, conn.transaction():
            yield PostgresTx(self._q, conn)

    @contextmanager
    def _caller_transaction(self, connection: object) -> Iterator[PostgresTx]:
        """The caller's transaction (begun by psycopg with the first statement); on a connection
        in autocommit, one of the statements' own, so that they still commit as one."""
        conn = self._external(connection)
        if conn.autocommit:
            with conn.transaction():
                yield PostgresTx(self._q, conn)
        else:
            yield PostgresTx(self._q, conn)

    # -- schema --------------------------------------------------------------------------------

    def schema_status(self) -> SchemaStatus:
        known = tuple(m.version for m in load_migrations("postgres"))
        with self._connection() as conn:
            sql = self._q["migration_table_exists"]
            applied: tuple[int, ...] = ()
            if _result(sql, conn.execute(sql)).first("found"):
                sql = self._q["migration_list"]
                listed = _result(sql, conn.execute(sql))
                version = listed.columns()["version"]
                applied = tuple(r[version] for r in listed.rows)
        return SchemaStatus(applied=applied, known=known)

    def _migrations(self) -> list[Migration]:
        return load_migrations("postgres", self.schema)

    @contextmanager
    def _migration_transaction(self, connection: object | None = None) -> Iterator[PostgresTx]:
        with (
            self._transaction() if connection is None else self._caller_transaction(connection)
        ) as tx:
            tx.fetch("migration_lock", {"schema": self.schema})
            tx.fetch(
                "migration_lock_timeout", {"milliseconds": str(int(MIGRATION_LOCK_TIMEOUT_MS))}
            )
            tx.fetch("migration_schema_create", {})
            yield tx

    def _migration_apply(self, tx: PostgresTx, migration: Migration) -> None:
        try:
            tx.conn.execute(migration.sql.encode("utf-8"))
        except pg_errors.LockNotAvailable:
            raise SchemaError(
                f"migration {migration.version} ({migration.name}) could not lock its "
                f"tables on {self.where} within {MIGRATION_LOCK_TIMEOUT_MS / 1000:g} s "
                "(a long transaction holds them); nothing was applied: retry"
            ) from None
        except psycopg.Error as exc:
            raise SchemaError(
                f"migration {migration.version} ({migration.name}) failed on "
                f"{self.where}: {str(exc).strip()}; nothing was applied"
            ) from None

    # -- clock ---------------------------------------------------------------------------------

    def clock_now(self) -> datetime:
        return self._required_instant(self._fetch("clock_now", {}).first("now"))

    def clock_set(self, setting: ClockSetting, audit: Audit | None = None) -> None:
        was = self.clock_get().describe() if audit is not None else ""
        with self._transaction() as tx:
            if setting.is_real:
                tx.fetch("clock_reset", {})
            else:
                params = {
                    "frozen_at": setting.frozen_at,
                    "offset_by": setting.offset,
                    "owner": setting.owner or process_owner(),
                    "expires_at": setting.expires_at,
                }
                tx.fetch("clock_write", params)
            if audit is not None:
                params = {
                    "actor": audit.actor,
                    "reason": audit.reason,
                    "details": json.dumps({"was": was}),
                }
                tx.fetch("clock_audit", params)

    def clock_get(self) -> ClockSetting:
        return self._record(ClockSetting, "clock_read", {}) or ClockSetting()

    # -- enqueue -------------------------------------------------------------------------------

    def _external(self, connection: object) -> psycopg.Connection[Any]:
        connection = driver_connection(connection)
        if isinstance(connection, LoopConnection) or (
            isinstance(connection, guard.GuardedConnection) and connection.wraps(psycopg.Connection)
        ):
            # the awaitable surface's, or a handler's (`connection=ctx.connection`: the job is
            # written through the guard, in the handler's savepoint): each answers what this
            # store asks of a connection
            return cast(psycopg.Connection[Any], connection)
        if not isinstance(connection, psycopg.Connection):
            raise ConfigurationError(
                f"connection= must be a psycopg.Connection for a PostgreSQL box, not "
                f"{type(connection).__name__}"
            )
        return connection

    def _insert_batches(self, rows: Iterable[InsertRow]) -> Iterator[tuple[int, str]]:
        # drawn lazily: the server inserts one chunk while the caller encodes the next
        for chunk in insert_chunks(rows, INSERT_CHUNK, INSERT_CHUNK_CHARS):
            yield len(chunk), _json_rows((k, _Json(a), g, p) for k, a, g, p in chunk)

    # -- jobs ----------------------------------------------------------------------------------

    @operation
    def job_rescue_expired(self, limit: int) -> list[RescuedJob]:
        rescued = self._records(RescuedJob, "job_rescue_expired", {"limit": limit})
        if any(job.state == "ready" for job in rescued):
            self.notify_work("jobs")
        return rescued

    def _audited(self, name: str, params: dict[str, Any]) -> ActionResult | None:
        """The action and its audit row, in one statement."""
        return self._record(ActionResult, name, params)

    def _audited_in(self, tx: PostgresTx, name: str, params: dict[str, Any]) -> ActionResult | None:
        """The same in the caller's transaction `tx`."""
        return tx.fetch(name, params).record(ActionResult, self._instant)

    # -- due times, pruning --------------------------------------------------------------------

    @operation
    def job_prune(self, task: str, older_than: timedelta, limit: int) -> int:
        params = {"task": task, "older_than_s": older_than.total_seconds(), "limit": limit}
        return len(self._apply("job_prune", params).rows)

    @operation
    def job_history_drop(
        self, keep: Mapping[str, timedelta | None], default: timedelta | None
    ) -> int:
        params = {
            "keep": json.dumps({t: None if k is None else _seconds(k) for t, k in keep.items()}),
            "default_s": None if default is None else _seconds(default),
        }
        try:
            dropped = self._fetch("job_history_drop", params)
        except pg_errors.LockNotAvailable:
            return 0  # a writer or a reader held on: the next pass tries again
        return int(dropped.first("jobs") or 0) if dropped.rows else 0

    @operation
    def job_history_tend(self, ahead: timedelta, limit: int) -> HistoryTended:
        """Three statements, each its own transaction: what is still to move, the weeks (a
        busy lock gives up, and the next pass tries again: the default partition holds a row
        whose week is late), and one batch moved."""
        waiting = self._fetch("job_history_waiting", {"limit": HISTORY_WAITING_CAP})
        first, count = self._instant(waiting.first("first_finished_at")), waiting.first("waiting")
        try:
            made: int | None = int(
                self._fetch(
                    "job_history_weeks", {"from_at": first, "ahead_s": ahead.total_seconds()}
                ).first("made")
            )
        except pg_errors.LockNotAvailable:
            made = None
        moved = (
            len(self._apply("job_history_move", {"limit": limit}).rows) if count and limit else 0
        )
        return HistoryTended(made, moved, int(count or 0))

    # -- the outbox ----------------------------------------------------------------------------

    @operation
    def outbox_lease(self, params: OutboxLeaseParams) -> list[OutboxLeased]:
        values = {
            "channels": list(params.channels),
            "limit": params.limit,
            "worker": params.worker,
            "token": params.token,
            "lease_s": params.lease_for.total_seconds(),
        }
        with self._connection() as conn:
            with one_round_trip(conn):
                conn.execute(self._q["outbox_lease_settings"])
                cursor = conn.execute(self._q["outbox_lease"], values)
            leased = _result(self._q["outbox_lease"], cursor)
        return self._leased_outbox(leased, params.token)

    @operation
    def outbox_finish(self, token: str, finishes: Sequence[OutboxFinishParams]) -> set[int]:
        if not finishes:
            return set()
        with self._connection() as conn:
            return self._finish_outbox(conn, token, finishes)

    def _outbox_finish_in(
        self, tx: PostgresTx, token: str, finishes: Sequence[OutboxFinishParams]
    ) -> set[int]:
        return self._finish_outbox(tx.conn, token, finishes)

    def _finish_outbox(
        self, conn: psycopg.Connection[Any], token: str, finishes: Sequence[OutboxFinishParams]
    ) -> set[int]:
        cells = (
            (
                f.id,
                f.state,
                f.outcome,
                f.counts_attempt,
                f.delay.total_seconds(),
                f.error,
                f.receipt,
                f.possible_duplicate,
                f.uncertain,
                f.rescued,
            )
            for f in finishes
        )
        params = {"token": token, "finishes": _json_rows(cells)}
        return {row[0] for row in conn.execute(self._q["outbox_finish"], params)}  # SELECT id

    # -- rate limits ---------------------------------------------------------------------------

    @operation
    def rate_bucket_configure(self, channel: str, specs: Sequence[BucketSpec]) -> None:
        self._apply(
            "rate_bucket_configure",
            {
                "channel": channel,
                "names": [b.name for b in specs],
                "capacities": [b.capacity for b in specs],
                "refills": [b.refill_per_s for b in specs],
            },
        )

    def _bucket_update(self, buckets: Sequence[BucketState]) -> dict[str, Any]:
        return {
            "names": [b.name for b in buckets],
            "tokens": [b.tokens for b in buckets],
            "updated": [b.updated_at for b in buckets],
        }

    # -- the key-drift guard ---------------------------------------------------------------------

    @operation
    def key_canary_accept(self, canary: KeyCanary, actor: str, reason: str) -> int:
        params = {**canary_params(canary), "actor": actor, "reason": reason}
        return int(self._apply("key_canary_accept", params).first("id"))

    @operation
    def schedule_run_take_over(self, take: ScheduleRunTakeOver) -> int | None:
        audit_id = self._apply("schedule_run_take_over", self._take_over(take)).first("audit_id")
        return None if audit_id is None else int(audit_id)

    # -- workers -------------------------------------------------------------------------------

    @operation
    def worker_beat(self, beat: WorkerBeat) -> None:
        self._apply("worker_beat", beat_params(beat))  # forgets the long-gone in the same statement

    # -- lanes ---------------------------------------------------------------------------------

    def consumer_session(self, settings: ConsumerSettings) -> PostgresConsumerSession:
        return PostgresConsumerSession(self, settings)

    def consumer_connection(self, settings: ConsumerSettings) -> psycopg.Connection[Any]:
        """A consumer's dedicated connection; its session settings bound claim waits and hung
        handlers on the server side, and its application_name shows it in pg_stat_activity."""
        millis = int(settings.transaction_timeout / timedelta(milliseconds=1))
        options = (
            f"-c lock_timeout={int(settings.lock_timeout / timedelta(milliseconds=1))} "
            f"-c idle_in_transaction_session_timeout={millis} -c statement_timeout={millis}"
        )
        if self.consumer_connect_params is None:
            return self.connect(
                autocommit=True, options=options, application_name=settings.application_name
            )
        params = self.consumer_connect_params()
        return self._open(
            **{
                "connect_timeout": int(self.connect_timeout),
                "application_name": settings.application_name,
                **params,
                "options": f"{params.get('options') or ''} {options}".strip(),
                "autocommit": True,
            }
        )

    def wait_for_work(self, timeout: float) -> frozenset[WorkKind]:
        """Wait for a NOTIFY in this schema: a job made ready (an insert, a replay, a release, a
        rescue) on `oncebox_jobs`, an outbox row on `oncebox_outbox`; the kinds seen."""
        try:
            if self._listener is None or self._listener.closed:
                self._listener = self.connect(autocommit=True, **self._named("oncebox listener"))
                self._listener.execute(self._q["work_listen"])
            kinds: set[WorkKind] = set()
            for notice in self._listener.notifies(timeout=timeout, stop_after=1):
                if notice.payload == self.schema:
                    kinds.add(_CHANNEL_KIND.get(notice.channel, "jobs"))
            return frozenset(kinds)
        except psycopg.OperationalError:
            if self._listener is not None:
                self._listener.close()
            self._listener = None
            return EVERY_KIND  # we may have missed a notification: look

    def notify_work(self, kind: WorkKind) -> None:
        self._fetch("job_notify" if kind == "jobs" else "outbox_notify", {"schema": self.schema})

    def check_identity(self) -> None:
        """A server's database is reached by name, never through an open file: nothing to see."""


class PostgresTx:
    """A write transaction on PostgreSQL (`PostgresStore._transaction`): a pooled connection in a
    transaction; its statements read `oncebox_now()` themselves and lock what they decide on."""

    __slots__ = ("_q", "conn")

    def __init__(self, queries: dict[str, LiteralString], conn: psycopg.Connection[Any]) -> None:
        self._q = queries
        self.conn = conn

    def fetch(self, name: str, params: dict[str, Any]) -> Result:
        sql = self._q[name]
        return _written(sql, self.conn.execute(sql, params))

    def fetch_each(self, name: str, params: Iterable[dict[str, Any]]) -> list[Result]:
        sql = self._q[name]
        with self.conn.pipeline():  # the server runs one while the caller draws the next
            cursors = [self.conn.execute(sql, one) for one in params]
        return [_written(sql, cursor) for cursor in cursors]

    def now(self) -> datetime:
        return _required_utc(self.fetch("clock_now", {}).first("now"))


class PostgresConsumerTx:
    """A consumer transaction on its lane's connection (`PostgresConsumerSession.transaction`).

    Its BEGIN is not a round trip of its own: it goes to the server in one pipeline with the
    transaction's first statement — the claim, as a rule — which spares a round trip per batch
    (and per job picked up at a trickle). A handler's own statements reach the raw connection,
    so the transaction has begun before any handler runs (`handler_scope`)."""

    __slots__ = ("_begun", "_conn", "_q", "_store")

    def __init__(self, store: PostgresStore, conn: psycopg.Connection[Any]) -> None:
        self._store = store
        self._conn = conn
        self._q = store._q
        self._begun = False

    def _execute(self, sql: LiteralString, params: dict[str, Any]) -> psycopg.Cursor[Any]:
        if self._begun:
            return self._conn.execute(sql, params)
        self._begun = True  # a failure below leaves a transaction to roll back
        with self._conn.pipeline():
            self._conn.execute(b"BEGIN")
            cursor = self._conn.execute(sql, params)
        return cursor

    def _begin(self) -> None:
        if not self._begun:
            self._begun = True
            self._conn.execute(b"BEGIN")

    def commit(self) -> None:
        if self._begun:
            self._conn.commit()  # COMMIT: the connection is in autocommit mode outside it

    def rollback(self) -> None:
        roll_back_quietly(self._conn)

    def intent_claim(self, claims: Sequence[IntentClaim]) -> set[str]:
        if not claims:
            return set()
        params = {"claims": _claim_rows(claims)}
        try:
            # fetchall: the rows built in one call (iterating the cursor costs a call per row)
            return {row[0] for row in self._execute(self._q["intent_claim"], params).fetchall()}
        except (pg_errors.LockNotAvailable, pg_errors.DeadlockDetected):
            raise ClaimLockTimeout(", ".join(c.key for c in claims[:3])) from None

    def outbox_insert(self, rows: Sequence[OutboxInsert]) -> None:
        if rows:
            self._execute(self._q["outbox_insert"], {"rows": _outbox_rows(rows)})

    def intent_owners(self, keys: Sequence[str]) -> dict[str, int | None]:
        if not keys:
            return {}
        sql = self._q["intent_owner_list"]
        owners = _result(sql, self._execute(sql, {"keys": list(keys)}))
        key, job_id = itemgetter("key", "job_id")(owners.columns())
        return {row[key]: row[job_id] for row in owners.rows}

    def intent_release(self, keys: Sequence[str]) -> None:
        if keys:
            self._execute(self._q["intent_release"], {"keys": list(keys)})

    def handler_scope(self) -> AbstractContextManager[HandlerConnection]:
        if not self._begun:
            self._begin()  # the handler's statements go straight to the connection
        return guard.HandlerScope(self._conn, self._execute_raw, self._status, None)

    def _execute_raw(self, sql: str) -> None:
        self._conn.execute(sql.encode("ascii"))

    def _status(self) -> str:
        if self._conn.closed or self._conn.broken:
            return "lost"
        status = self._conn.info.transaction_status
        if status == pq.TransactionStatus.INTRANS:
            return "ok"
        if status == pq.TransactionStatus.INERROR:
            return "aborted"
        return "gone"

    def job_finish(self, token: str, finishes: Sequence[JobFinish]) -> set[int]:
        if not finishes:
            return set()
        params = {"token": token, "finishes": _finish_rows(finishes)}
        return {row[0] for row in self._execute(self._q["job_finish"], params).fetchall()}

    def job_settle_relayed(self, finishes: Sequence[RelayedFinish]) -> set[int]:
        if not finishes:
            return set()
        params = {"finishes": _relayed_rows(finishes)}
        return {row[0] for row in self._execute(self._q["job_settle_relayed"], params)}

    def counter_add(self, deltas: Mapping[str, int]) -> None:
        if any(deltas.values()):
            params = {"deltas": json.dumps(dict(sorted(deltas.items())))}
            self._execute(self._q["counter_add"], params)


class PostgresConsumerSession:
    dialect = "postgres"

    def __init__(self, store: PostgresStore, settings: ConsumerSettings) -> None:
        self._store = store
        self._settings = settings
        self._q = store._q
        self._conn = store.consumer_connection(settings)
        self._ran_dry = True  # the first lease of a worker looks ahead too
        self._due: DueTime | None = None

    def _ensure(self) -> psycopg.Connection[Any]:
        """The connection, reopened if the last one was lost (server restart, terminated
        backend): the failure surfaced once as `StoreUnavailable`; the next call recovers."""
        if self._conn.closed:
            self._conn = self._store.consumer_connection(self._settings)
        return self._conn

    def _run(self, name: str, call: Callable[[], T]) -> T:
        with self._store.metrics.timed(name):
            try:
                self._ensure()
                return call()
            except psycopg.OperationalError as exc:
                if isinstance(exc, pg_errors.LockNotAvailable):
                    raise
                raise self._store._unavailable(exc) from None
            except (
                pg_errors.UndefinedTable,
                pg_errors.UndefinedFunction,
                pg_errors.InvalidSchemaName,
            ) as exc:
                raise self._store._missing_tables(exc) from None

    def job_lease(self, params: JobLeaseParams) -> list[LeasedJob]:
        values = {
            "tasks": list(params.tasks),
            "queues": list(params.queues),
            "limit": params.limit,
            "worker": params.worker,
            "token": params.token,
            "lease_s": params.lease_for.total_seconds(),
            "slots": params.slots,
        }
        plan = params.limits
        if plan and any(task in plan.tasks for task in params.tasks):
            return self._run("job_lease", lambda: self._lease_limited(values, plan))
        return self._store._leased_jobs(self._run("job_lease", lambda: self._lease(values)))

    def _lease_limited(self, values: dict[str, Any], plan: LimitPlan) -> list[LeasedJob]:
        """A lease of limited and unlimited tasks, in one transaction (`store/allocation.py`):
        under the limits' lock, the survey (one round trip), the candidates of the partitions
        with room (one more), then the chosen jobs, the buckets spent, the unlimited tasks' lease
        for what is left of the batch and, when it comes back short, the next due time (one
        more). Limited jobs go first: they take at most what their limits allow. The rest of the
        batch is leased from every task's jobs that carry no partition (a limited task's
        enqueued before its limit, or by a release without it, run around the limit)."""
        conn, q, store = self._conn, self._q, self._store
        limited, free = limited_lease.split(plan, values["tasks"])
        plan = plan.only(limited)  # only its own limits are locked and surveyed
        survey_values = limited_lease.survey_params(plan, limited)
        limit = values["limit"]
        try:
            with conn.pipeline():
                conn.execute(b"BEGIN")
                conn.execute(q["job_lease_settings"])
                reads = [conn.execute(q[name], survey_values) for name in SURVEY]
            results = [_result(q[name], cursor) for name, cursor in zip(SURVEY, reads, strict=True)]
            now = store._required_instant(results[0].first("now"))
            survey = limited_lease.survey_of(now, results, _utc)
            room = allocation.rooms(plan, survey)
            slots = values["slots"]
            wanted = allocation.asks(plan, survey, room, limit, slots=slots)
            candidates: list[allocation.Candidate] = []
            if wanted:
                sql = q["job_limited_candidates"]
                found = conn.execute(sql, limited_lease.candidates_params(wanted, values["queues"]))
                candidates = limited_lease.candidates_of(_result(sql, found), _utc)
            choice = allocation.choose(plan, survey, room, candidates, limit, slots=slots)
            rest = limit - len(choice.picks)
            with conn.pipeline():
                took = free_took = free_due = None
                if choice.picks:
                    picks = limited_lease.picks_json(choice)
                    took = conn.execute(q["job_lease_limited"], {**values, "picks": picks})
                if choice.spends:
                    spends = limited_lease.spends_json(choice.spends, datetime.isoformat)
                    spend = {"spends": spends, "token": values["token"]}
                    conn.execute(q["limit_spend"], spend)  # what was leased: after the lease
                if rest > 0:
                    free_took = conn.execute(q["job_lease"], {**values, "limit": rest})
                    if free:
                        free_due = conn.execute(q["job_next_due"], {**values, "tasks": free})
                conn.execute(b"COMMIT")
        except BaseException:
            roll_back_quietly(conn)
            raise
        jobs = [] if took is None else store._leased_jobs(_result(q["job_lease_limited"], took))
        if free_took is not None:
            jobs += store._leased_jobs(_result(q["job_lease"], free_took))
        if len(jobs) < limit:
            times = [choice.next_at]
            if free_due is not None:
                times.append(_utc(_result(q["job_next_due"], free_due).first("at")))
            at = min((t for t in times if t is not None), default=None)
            self._due = DueTime(at, survey.now)
        return jobs

    def _lease(self, values: dict[str, Any]) -> Result:
        """The lease and its settings (see `job_lease_settings`), sent together: one round trip.
        When the last lease came back short (the queue is running dry, or idle), the next due
        time is read in the same transaction, so an idle poll is one transaction, not two."""
        conn = self._conn
        look_ahead = self._ran_dry
        due = None
        with one_round_trip(conn):
            conn.execute(self._q["job_lease_settings"])
            cursor = conn.execute(self._q["job_lease"], values)
            if look_ahead:
                due = conn.execute(
                    self._q["job_next_due"], {"tasks": values["tasks"], "queues": values["queues"]}
                )
        leased = _result(self._q["job_lease"], cursor)
        self._ran_dry = len(leased.rows) < values["limit"]
        if due is not None:
            self._due = _result(self._q["job_next_due"], due).record(DueTime, _utc)
        return leased

    def due_seen(self) -> DueTime | None:
        due, self._due = self._due, None
        return due

    def job_release(self, params: JobReleaseParams) -> int:
        values = {
            "jobs": _json_rows(params.jobs),
            "token": params.token,
            "delay_s": params.delay.total_seconds(),
        }
        released = self._run(
            "job_release",
            lambda: len(self._conn.execute(self._q["job_release"], values).fetchall()),
        )
        if released:
            self._run(
                "job_notify",
                lambda: self._conn.execute(self._q["job_notify"], {"schema": self._store.schema}),
            )
        return released

    @contextmanager
    def transaction(self) -> Iterator[PostgresConsumerTx]:
        with self._store.metrics.timed("consumer_transaction"):
            try:
                tx = PostgresConsumerTx(self._store, self._ensure())
                try:
                    yield tx
                except BaseException:
                    tx.rollback()
                    raise
                tx.commit()
            except psycopg.OperationalError as exc:
                if isinstance(exc, pg_errors.LockNotAvailable):
                    raise
                raise self._store._unavailable(exc) from None
            except (
                pg_errors.UndefinedTable,
                pg_errors.UndefinedFunction,
                pg_errors.InvalidSchemaName,
            ) as exc:
                raise self._store._missing_tables(exc) from None
            except psycopg.DatabaseError as exc:  # a constraint, a trigger, a value refused
                raise StoreRefused(
                    f"the database refused the transaction: {type(exc).__name__}: "
                    f"{str(exc).strip()}"
                ) from None

    def close(self) -> None:
        self._conn.close()
