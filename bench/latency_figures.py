"""What workload 4's scripts share: stopping the worker process and reading the figures.

Standard library only: bench/latency.py imports it, and so do bench/peers/*_latency.py, which run
in the peers' own virtual environment (.venv-peers), where oncebox is not installed.
"""

from __future__ import annotations

import os
import signal
import statistics
from multiprocessing.process import BaseProcess

DRAIN_TIMEOUT = 30.0  # seconds the last measured jobs get to reach their handler


def stop(worker: BaseProcess) -> None:
    """SIGTERM (graceful: the worker writes its start times), then SIGKILL after 30 s."""
    if worker.pid is not None and worker.is_alive():
        os.kill(worker.pid, signal.SIGTERM)
    worker.join(30)
    if worker.is_alive():
        worker.kill()
        worker.join(5)


def percentiles(
    who: str, started: dict[int, float], before: list[float], after: list[float], warm: int
) -> dict[str, float]:
    """The figures of the jobs after the warm-up; SystemExit if one was never started.

    `started[n]` is when job n's handler began, `before[n]` and `after[n]` when its enqueue call
    was made and returned: pick-up runs from `after`, `call` from `before`."""
    measured = range(warm, len(after))
    missing = [n for n in measured if n not in started]
    if missing:
        raise SystemExit(
            f"{who}: {len(missing)} of {len(measured)} measured jobs never reached their handler "
            f"within {DRAIN_TIMEOUT:g} s (first: n={missing[0]})"
        )
    pickup = sorted(started[n] - after[n] for n in measured)
    call = [started[n] - before[n] for n in measured]
    enqueue = [after[n] - before[n] for n in measured]
    cuts = statistics.quantiles(pickup, n=100, method="inclusive")
    call_cuts = statistics.quantiles(call, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49] * 1000, 2),
        "p90_ms": round(cuts[89] * 1000, 2),
        "p99_ms": round(cuts[98] * 1000, 2),
        "max_ms": round(pickup[-1] * 1000, 2),
        "count": len(pickup),
        "call_p50_ms": round(call_cuts[49] * 1000, 2),
        "call_p99_ms": round(call_cuts[98] * 1000, 2),
        "enqueue_p50_ms": round(statistics.median(enqueue) * 1000, 2),
    }
