"""oncebox: retry freely, effect once.

One durable intent per business key, claimed in the same transaction as the work it guards; the
queue delivers at least once, the consumer absorbs the duplicates. See README.md and docs/.
"""

from __future__ import annotations

from oncebox.box import Box, EnqueueManyResult, EnqueueResult
from oncebox.deliveries.reports import Reports
from oncebox.jobs.debounce import Debounce, Throttle
from oncebox.jobs.limits import Concurrency, Rate
from oncebox.jobs.retry import Retry
from oncebox.jobs.tasks import Task
from oncebox.kernel.clock import ClockSetting
from oncebox.kernel.errors import (
    ClockHeld,
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
    StoreRefused,
    StoreUnavailable,
    TransactionControlRefused,
    UnknownTask,
)
from oncebox.lanes.consumer import ConsumerConfig, ConsumerResult, FailedAttempt
from oncebox.lanes.worker import WorkerConfig, WorkerResult
from oncebox.queue.context import JobContext
from oncebox.retention.policy import Retention
from oncebox.runtime.operations import ActionOutcome
from oncebox.schedules.schedule import ScheduleContext
from oncebox.schedules.slo import Slo
from oncebox.timers.sweeper import SweepContext

__version__ = "0.1.0.dev0"

__all__ = [
    "ActionOutcome",
    "Box",
    "ClockHeld",
    "ClockSetting",
    "Concurrency",
    "ConfigurationError",
    "ConsumerConfig",
    "ConsumerResult",
    "Debounce",
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
    "Rate",
    "Reports",
    "Retention",
    "Retry",
    "RetryLater",
    "ScheduleContext",
    "SchemaError",
    "Slo",
    "StoreRefused",
    "StoreUnavailable",
    "SweepContext",
    "Task",
    "Throttle",
    "TransactionControlRefused",
    "UnknownTask",
    "WorkerConfig",
    "WorkerResult",
    "__version__",
]
