"""oncebox: retry freely, effect once.

One durable intent per business key, claimed in the same transaction as the work it guards; the
queue delivers at least once, the consumer absorbs the duplicates. See README.md and docs/.
"""

from __future__ import annotations

from oncebox.box import Box, EnqueueManyResult, EnqueueResult
from oncebox.clock import ClockSetting
from oncebox.consumer import ConsumerConfig, ConsumerResult, FailedAttempt
from oncebox.context import JobContext
from oncebox.errors import (
    ConfigurationError,
    DrainFailed,
    EnqueueError,
    HandlerTimeout,
    InvalidArguments,
    InvalidKey,
    InvalidState,
    KeyTemplateError,
    LeaseLost,
    NotFound,
    OnceboxError,
    PayloadTooLarge,
    Permanent,
    RetryLater,
    SchemaError,
    StoreUnavailable,
    TransactionControlRefused,
    UnknownTask,
)
from oncebox.operations import ActionOutcome
from oncebox.retry import Retry
from oncebox.tasks import Task
from oncebox.worker import WorkerConfig, WorkerResult

__version__ = "0.1.0.dev0"

__all__ = [
    "ActionOutcome",
    "Box",
    "ClockSetting",
    "ConfigurationError",
    "ConsumerConfig",
    "ConsumerResult",
    "DrainFailed",
    "EnqueueError",
    "EnqueueManyResult",
    "EnqueueResult",
    "FailedAttempt",
    "HandlerTimeout",
    "InvalidArguments",
    "InvalidKey",
    "InvalidState",
    "JobContext",
    "KeyTemplateError",
    "LeaseLost",
    "NotFound",
    "OnceboxError",
    "PayloadTooLarge",
    "Permanent",
    "Retry",
    "RetryLater",
    "SchemaError",
    "StoreUnavailable",
    "Task",
    "TransactionControlRefused",
    "UnknownTask",
    "WorkerConfig",
    "WorkerResult",
    "__version__",
]
