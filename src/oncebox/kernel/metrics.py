"""In-process counters and store-operation timings: the one instrumented chokepoint.

Every store operation passes `Metrics.timed` (through the stores' `@operation` decorator), and
lanes count lifecycle events here (claim conflicts, leases lost, enqueue dedupes, ...). Durable
figures (jobs by state, dead letters) are read from the database; these are the per-process ones
that have no row to live in — an enqueue deduplicated at the door writes nothing, by design.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import wraps
from typing import Concatenate, ParamSpec, Protocol, TypeVar, cast

from oncebox.kernel import clock


@dataclass
class OperationStats:
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0


class Metrics:
    """Thread-safe counters and per-operation timings for one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: Counter[str] = Counter()
        self._operations: dict[str, OperationStats] = {}

    def count(self, name: str, amount: int = 1) -> None:
        if amount:
            with self._lock:
                self._counters[name] += amount

    def counter(self, name: str) -> int:
        with self._lock:
            return self._counters[name]

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def operations(self) -> dict[str, OperationStats]:
        with self._lock:
            return {name: OperationStats(**vars(stats)) for name, stats in self._operations.items()}

    @contextmanager
    def timed(self, operation: str) -> Iterator[None]:
        started = clock.monotonic()
        ok = False
        try:
            yield
            ok = True
        finally:
            elapsed = clock.monotonic() - started
            with self._lock:
                stats = self._operations.setdefault(operation, OperationStats())
                stats.calls += 1
                stats.errors += 0 if ok else 1
                stats.seconds += elapsed
                stats.max_seconds = max(stats.max_seconds, elapsed)


class Instrumented(Protocol):
    metrics: Metrics


P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound=Instrumented)


def operation(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """Time a store method under its own name in the store's `metrics`."""
    name = method.__name__

    @wraps(method)
    def timed(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.metrics.timed(name):
            return method(self, *args, **kwargs)

    return cast(Callable[Concatenate[S, P], R], timed)
