"""Every error oncebox raises, in one hierarchy.

    OnceboxError
    ├── ConfigurationError          a task, template, URL or setting is wrong (fix the code/config)
    │   ├── KeyTemplateError        a key template is malformed or names a missing argument
    │   ├── MissingExtra            what was asked for needs an extra that is not installed
    │   └── InvalidInput            a value from outside no store keeps (a NUL, an id past 2^63)
    ├── EnqueueError                a job was refused at enqueue; nothing was written
    │   ├── InvalidKey              the rendered key breaks the key rules
    │   ├── InvalidArguments        args are not JSON, or do not fit the task's signature
    │   ├── PayloadTooLarge         encoded args exceed the size limit
    │   └── UnknownTask             no task of that name is registered
    ├── SchemaError                 the database schema is missing, older or unknown
    ├── KeyDrift                    a task's key template or a schedule's periods changed
    ├── ClockHeld                   another process froze or offset the database's clock
    ├── StoreUnavailable            the database cannot be reached (retryable for lanes)
    │   └── ConnectionLost          the consumer's connection broke while a handler ran on it
    ├── StoreRefused                the database refused a transaction's writes (a constraint)
    ├── BrokerUnavailable           a broker cannot be reached (retryable for lanes)
    ├── BrokerRefused               a broker refused a publish or a declaration
    ├── NotFound                    no job, key or row matches what was asked for
    ├── InvalidState                the row exists but the operation does not apply to its state
    ├── TransactionControlRefused   a handler tried to commit or roll back the claim's transaction
    │   └── TransactionEnded        the claim's transaction ended under a handler anyway
    ├── LeaseLost                   this worker's lease was superseded; its transaction is refused
    ├── HandlerTimeout              a handler exceeded its timeout
    ├── RetryLater                  raised by a handler: try again later (optionally after `delay`)
    ├── Permanent                   raised by a handler: dead-letter now, never retry
    └── DrainFailed                 `oncebox.testing.drain` saw failed attempts

`RetryLater` and `Permanent` are the two signals a handler can send on purpose; any other
exception a handler raises is classified by the task's `Retry` policy (retryable unless declared
permanent).
User mistakes (configuration, enqueue, not found, invalid state) carry a message written to be
shown as is, on one line, without a traceback.
"""

from __future__ import annotations

from datetime import timedelta


class OnceboxError(Exception):
    """Base class of every error oncebox raises on purpose."""


class ConfigurationError(OnceboxError):
    """A task declaration, template, URL or setting is wrong; fix the code or configuration."""


class KeyTemplateError(ConfigurationError):
    """A key template is malformed or refers to an argument the task does not have."""


class MissingExtra(ConfigurationError):
    """What was asked for (the console, a broker's queue, handlers' SQLAlchemy sessions) needs
    one of oncebox's extras, which is not installed: the message names the one to install."""

    def __init__(self, extra: str, what: str, module: str | None) -> None:
        missing = f" (no module named {module!r})" if module else ""
        super().__init__(f"{what} needs an extra: pip install 'oncebox[{extra}]'{missing}")
        self.extra = extra
        self.module = module


class InvalidInput(ConfigurationError):
    """A value that came from outside — a filter, a form field, an id, an event's text — refused
    where it arrived, before anything is read or written, saying what and where: text no store keeps
    (a NUL, a lone surrogate), an id that is no row id (past 2^63 - 1;
    `oncebox.kernel.storable`)."""


class EnqueueError(OnceboxError):
    """A job was refused at enqueue. Nothing was written."""


class InvalidKey(EnqueueError):
    """The key rendered from a job's arguments breaks the key rules."""


class InvalidArguments(EnqueueError):
    """The job's arguments are not JSON-encodable or do not fit the task's signature."""


class PayloadTooLarge(EnqueueError):
    """The encoded arguments are larger than the configured limit."""

    def __init__(self, size: int, limit: int, task: str) -> None:
        super().__init__(
            f"arguments of task {task!r} are {size} bytes as JSON; the limit is {limit} bytes "
            "(pass ids and look the data up in the handler, or raise max_payload_bytes)"
        )
        self.size = size
        self.limit = limit


class UnknownTask(EnqueueError):
    """No task of that name is registered with this box."""


class SchemaError(OnceboxError):
    """The database schema is missing, older than this code needs, or damaged."""


class KeyDrift(OnceboxError):
    """This code renders a task's keys (or a schedule's periods) differently from what the store
    recorded: running it would mint keys that do not collide with those already claimed. Refused
    until an operator runs `oncebox keys accept`. Not a user mistake and not permanent: a job
    that hits it is retried, and succeeds once the change is accepted or rolled back."""


class StoreUnavailable(OnceboxError):
    """The database cannot be reached. Lanes back off and try again; commands exit 1."""


class ConnectionLost(StoreUnavailable):
    """The claim's connection broke while a handler ran on it (the server stopped, or ended the
    session of a handler past its timeout): the store went away under that handler, whatever
    the handler made of the driver's error. Its attempt counts; its batch's others do not."""


class StoreReplaced(OnceboxError):
    """The SQLite file this process opened is no longer the one at its path: a restore moved
    another into place, or it was deleted. Open connections would go on reading and writing the
    old file, unseen by anyone, so a worker stops; started again, it opens the file now there."""


class ClockHeld(OnceboxError):
    """Another process (a test, the demo, the chaos harness) froze or offset the database's
    clock, and its setting is in force. A worker refuses to run on it — leases would never
    expire, retries never fall due — unless it was told the clock is simulated on purpose."""


class StoreRefused(OnceboxError):
    """The database refused the writes of a consumer transaction for what they hold: a
    constraint (checked at COMMIT when deferred), a trigger, a value it cannot store. The same
    writes would be refused again, so the consumer finds the job that caused it and spends that
    job's attempt, instead of giving the batch back."""


class BrokerUnavailable(OnceboxError):
    """A broker could not be reached, or the connection to it was lost. `maybe_published`: lost
    while a publish waited for its confirm — the broker may have taken it."""

    def __init__(self, message: str, *, maybe_published: bool = False) -> None:
        super().__init__(message)
        self.maybe_published = maybe_published


class BrokerRefused(OnceboxError):
    """A broker did not take a publish (not routable, or negatively confirmed), or refused to
    declare a queue (one of that name exists, declared otherwise)."""


class NotFound(OnceboxError):
    """No job, key or row matches what was asked for."""


class InvalidState(OnceboxError):
    """The row exists, but the requested operation does not apply to its current state."""


class TransactionControlRefused(OnceboxError):
    """A handler tried to commit, roll back or close the claim's transaction.

    The claim, the handler's writes and the job's completion commit together or not at all; a
    handler that commits on its own would break that, so the connection it receives refuses.
    """


class TransactionEnded(TransactionControlRefused):
    """The claim's transaction ended under a handler (a COMMIT the guard could not see, SQLite's
    `INSERT OR ROLLBACK`, an automatic rollback on an I/O error). What it held may be committed or
    rolled back; the consumer stops using the batch and settles it from what the database shows.
    """


class LeaseLost(OnceboxError):
    """This worker's lease on a job was superseded (it expired and another worker took over)."""


class HandlerTimeout(OnceboxError):
    """A handler ran longer than its task's timeout."""


class RetryLater(OnceboxError):
    """Raised by a handler to ask for another attempt, optionally after a specific delay.

    The attempt still counts towards the task's `max_attempts`.
    """

    def __init__(self, reason: str = "retry requested", delay: timedelta | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Permanent(OnceboxError):
    """Raised by a handler when another attempt cannot succeed: the job is dead-lettered now."""


class DrainFailed(OnceboxError):
    """`oncebox.testing.drain` saw attempts fail; the message lists each one."""
