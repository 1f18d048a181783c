"""The connection a handler receives: the claim's own connection, guarded.

Why guarded: the claim, the handler's business writes, its outbox rows and the job's completion
must commit together or not at all. A handler that commits (or rolls back, or closes) the
connection would split them, so those calls are refused with `TransactionControlRefused`, and so
is transaction-control SQL sent through `execute` (BEGIN, COMMIT, ROLLBACK, END, ...; a handler's
own `SAVEPOINT`/`ROLLBACK TO`/`RELEASE` are fine).

Why lazy: a batch of jobs shares one transaction, and each handler that touches the connection
gets a savepoint so its failure undoes only its own writes. Handlers that never touch the
connection (most of them only write outbox rows, which are buffered) cost no savepoint round trip,
so the savepoint is opened on first use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from oncebox.kernel.errors import ConnectionLost, TransactionControlRefused, TransactionEnded

SAVEPOINT = "oncebox_handler"

_TX_WORDS = (
    r"(BEGIN|COMMIT|END|ABORT|START\s+TRANSACTION|PREPARE\s+TRANSACTION|VACUUM|DETACH|ATTACH"
    r"|ROLLBACK(?!\s+(?:TRANSACTION\s+|WORK\s+)?TO\b))\b"
)
_TX_CONTROL = re.compile(_TX_WORDS, re.IGNORECASE)
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")


def _is_word(char: str) -> bool:
    return char.isalnum() or char in "_$"


def statement_heads(text: str) -> Iterator[str]:
    """The beginning of each statement in `text`, past its leading whitespace and comments.

    A small lexer in PostgreSQL's terms, which are the strictest here: `--` comments, block
    comments that nest (`/* /* */ */` is one comment), '…' strings (`E'…'` with backslash
    escapes), "…" identifiers and $tag$…$tag$ bodies; a `;` outside all of them starts the next
    statement (the simple query protocol runs every one). Where a text could be read two ways,
    it errs towards seeing a statement boundary: refusing too much names a mistake, seeing too
    little would let a COMMIT through."""
    i, n, start = 0, len(text), True
    while i < n:
        char = text[i]
        if char.isspace():
            i += 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif char == ";":
            start, i = True, i + 1
        else:
            if start:
                yield text[i : i + 64]
                start = False
            i = _skip_token(text, i)


def _skip_token(text: str, i: int) -> int:
    """The index after the token (or the literal) that begins at `i`."""
    char, n = text[i], len(text)
    escapes = char in "Ee" and text.startswith("'", i + 1) and not (i and _is_word(text[i - 1]))
    if escapes:
        i += 1
    if text[i] in "'\"":
        quote, i = text[i], i + 1
        while i < n:
            if escapes and text[i] == "\\":
                i += 2
            elif text[i] == quote:
                if not text.startswith(quote, i + 1):
                    return i + 1
                i += 2  # a doubled quote stands for itself
            else:
                i += 1
        return n
    if char == "$" and not (i and _is_word(text[i - 1])):
        tag = _DOLLAR_TAG.match(text, i)
        if tag:
            end = text.find(tag.group(), tag.end())
            return n if end < 0 else end + len(tag.group())
    if _is_word(char):
        while i < n and _is_word(text[i]):
            i += 1
        return i
    return i + 1


_REFUSED_CALLS = {
    "commit": "commit",
    "rollback": "roll back",
    "close": "close",
    "executescript": "run scripts on",  # sqlite3: executescript() commits first
    "set_autocommit": "change autocommit on",
    "tpc_begin": "begin two-phase commit on",
    "tpc_commit": "commit",
    "tpc_rollback": "roll back",
}
# what would hand out the driver's own connection, around the guard: libpq's handle, and the
# driver's private attributes (`cursor._conn`, …)
_HIDDEN = frozenset({"pgconn"})


def _forwardable(name: str) -> str:
    if name in _HIDDEN:
        raise refusal(f"reach {name} of")
    if name.startswith("_"):  # an AttributeError, as `hasattr` and copy/pickle probes expect
        raise AttributeError(f"{name} of the claim's connection is not reachable from a handler")
    return name


def refusal(what: str) -> TransactionControlRefused:
    return TransactionControlRefused(
        f"a handler may not {what} the claim's connection: the claim, the handler's writes and "
        "the job's completion commit together; raise an exception to undo this job's writes"
    )


def check_statement(query: object, raw: Any = None) -> None:
    """Refuse transaction-control SQL as any statement of the text (`statement_heads`).
    Composed queries (psycopg's `sql.SQL`) are rendered first. This names the mistake early;
    the consumer also checks, after every handler, that its transaction is still open, and
    settles the batch from what really committed if it is not."""
    if hasattr(query, "as_string") and raw is not None:
        query = query.as_string(raw)
    if not isinstance(query, (str, bytes)):
        return
    text = query.decode("utf-8", "replace") if isinstance(query, bytes) else query
    for head in statement_heads(text):
        match = _TX_CONTROL.match(head)
        if match:
            raise refusal(f"run {match.group(1).split(None, 1)[0].upper()} on")


class GuardedCursor:
    """A driver cursor whose execute calls are checked like the connection's; its
    `.connection` is the guarded connection, never the raw one."""

    def __init__(self, raw: Any, connection: GuardedConnection) -> None:
        self._raw = raw
        self.connection = connection

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        check_statement(query, self.connection._raw)
        result = self._raw.execute(query, *args, **kwargs)
        return self if result is self._raw else result

    def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        check_statement(query, self.connection._raw)
        result = self._raw.executemany(query, *args, **kwargs)
        return self if result is self._raw else result

    def executescript(self, *_args: Any, **_kwargs: Any) -> Any:
        raise refusal("run scripts on")

    def __iter__(self) -> Iterator[Any]:
        return iter(self._raw)

    def __enter__(self) -> GuardedCursor:
        self._raw.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, _forwardable(name))


class GuardedConnection:
    """Forwards to the driver connection, refusing transaction control; see the module doc."""

    _raw: Any
    _on_first_use: Callable[[], None] | None
    _closed: bool

    def __init__(self, raw: Any, on_first_use: Callable[[], None]) -> None:
        # straight into the instance's dict: the guard's own __setattr__ is for what a handler
        # sets (one guard per job, on the consumer's hot path)
        fields = self.__dict__
        fields["_raw"] = raw
        fields["_on_first_use"] = on_first_use
        fields["_closed"] = False

    @property
    def touched(self) -> bool:
        return self._on_first_use is None

    def wraps(self, kind: type) -> bool:
        """Whether the driver connection under the guard is a `kind` (a store checking that
        `connection=ctx.connection` is one of its own dialect's)."""
        return isinstance(self._raw, kind)

    def _use(self) -> Any:
        if self._closed:
            raise TransactionControlRefused(
                "this connection belonged to a handler that has returned; it cannot be used "
                "after the handler ends"
            )
        if self._on_first_use is not None:
            first_use, self._on_first_use = self._on_first_use, None
            first_use()
        return self._raw

    def end(self) -> None:
        """Called by the consumer when the handler returns; later use is refused."""
        self.__dict__["_closed"] = True

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        check_statement(query, self._raw)
        return GuardedCursor(self._use().execute(query, *args, **kwargs), self)

    def executemany(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        check_statement(query, self._raw)
        return GuardedCursor(self._use().executemany(query, *args, **kwargs), self)

    def cursor(self, *args: Any, **kwargs: Any) -> GuardedCursor:
        return GuardedCursor(self._use().cursor(*args, **kwargs), self)

    def __enter__(self) -> GuardedConnection:
        raise refusal("use `with` (which commits or closes) on")

    def __exit__(self, *exc: object) -> None:
        raise refusal("use `with` (which commits or closes) on")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        if name in {"autocommit", "isolation_level"}:
            raise refusal(f"set {name} on")
        setattr(self._use(), name, value)

    def __getattr__(self, name: str) -> Any:
        if name in _REFUSED_CALLS:
            raise refusal(_REFUSED_CALLS[name])
        return getattr(self._use(), _forwardable(name))


_ENDED = (
    "the claim's transaction ended while a handler ran (transaction control the guard could not "
    "see, or a rollback by the database); the batch is settled from what the database shows"
)
_LOST = "the connection to the database broke while this handler ran on it"


def handler_scope(
    raw: Any,
    execute: Callable[[str], None],
    transaction_status: Callable[[], str],
    protect: Callable[[], Callable[[], None]] | None = None,
) -> HandlerScope:
    """Run one handler against `raw` inside a lazily opened savepoint.

    `execute` runs a statement on the raw connection; `transaction_status` says whether the
    connection is still in a healthy transaction: "ok", "aborted" (a statement failed and the
    handler carried on), "gone" (the transaction ended under the handler) or "lost" (the
    connection itself broke: the server ended it, or the network did). `protect`, if
    given, installs a driver-level refusal of transaction statements and returns its undo.
    Whatever the handler did, a "gone" transaction raises `TransactionEnded`, and a "lost"
    connection `ConnectionLost`: the consumer runs no other handler on it.
    """
    return HandlerScope(raw, execute, transaction_status, protect)


class HandlerScope:
    """`with handler_scope(...) as connection:` — a plain class, not a generator: it wraps
    every handler call."""

    __slots__ = ("_execute", "_guarded", "_protect", "_status", "_undo")

    def __init__(
        self,
        raw: Any,
        execute: Callable[[str], None],
        transaction_status: Callable[[], str],
        protect: Callable[[], Callable[[], None]] | None,
    ) -> None:
        self._execute = execute
        self._status = transaction_status
        self._protect = protect
        self._undo: Callable[[], None] | None = None
        self._guarded = GuardedConnection(raw, self._open_savepoint)

    def _open_savepoint(self) -> None:
        self._execute(f"SAVEPOINT {SAVEPOINT}")

    def __enter__(self) -> GuardedConnection:
        self._undo = self._protect() if self._protect is not None else None
        return self._guarded

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: object
    ) -> None:
        try:
            self._guarded.end()
            if self._undo is not None:
                self._undo()
        except BaseException as failure:
            self._after_failure(failure)
            raise
        if error is not None:
            self._after_failure(error)
            return  # the handler's exception goes on
        if self._guarded._on_first_use is None:  # it touched the connection: settle its savepoint
            self._after_return()

    def _after_failure(self, error: BaseException) -> None:
        """The handler raised: undo what it wrote, unless the transaction is beyond that."""
        if not self._guarded.touched:
            return
        status = self._status()
        if status == "lost":  # the connection itself is gone: a store failure, not the handler's
            raise ConnectionLost(_LOST) from error
        if status == "gone":
            raise TransactionEnded(_ENDED) from error
        self._execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
        self._execute(f"RELEASE SAVEPOINT {SAVEPOINT}")

    def _after_return(self) -> None:
        status = self._status()
        if status == "lost":  # it carried on past the driver's error
            raise ConnectionLost(_LOST)
        if status == "gone":
            raise TransactionEnded(_ENDED)
        if status == "aborted":
            self._execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}")
            self._execute(f"RELEASE SAVEPOINT {SAVEPOINT}")
            raise TransactionControlRefused(
                "the handler returned with its transaction aborted (it caught a database error "
                "and carried on); its writes were undone and the attempt counts as failed"
            )
        self._execute(f"RELEASE SAVEPOINT {SAVEPOINT}")
