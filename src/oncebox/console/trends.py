"""The overview's chart: backlog, throughput and sends per minute over the last hours.

Sampled by the console in the background, once a minute, from the same definitions as everything
else — the depths (`job_count_by_state`, `outbox_count_by_state`) and the durable counters
(`jobs_completed`, `sends_sent`), read at the store's time — and kept in memory for six hours: a
console restarted an hour ago shows an hour. A rate is the difference of two counter readings
over the store time between them, so a sample missed (the store was away) widens a step; it never
invents one.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from oncebox.kernel.counters import complete
from oncebox.kernel.errors import OnceboxError
from oncebox.store.protocol import Store

EVERY_S = 60.0
KEPT = 6 * 60  # samples: six hours at one a minute

log = logging.getLogger("oncebox.console")


@dataclass(frozen=True)
class Sample:
    at: float  # the store's time, epoch seconds
    ready: int  # jobs waiting (ready)
    pending: int  # messages waiting to be sent
    completed: int  # the jobs_completed counter
    sent: int  # the sends_sent counter


class Trends:
    def __init__(self, store: Store, kept: int = KEPT) -> None:
        self.store = store
        self._samples: deque[Sample] = deque(maxlen=kept)
        self._lock = threading.Lock()

    def sample(self) -> Sample:
        counters = complete(self.store.counter_list())
        jobs, messages = self.store.job_count_by_state(), self.store.outbox_count_by_state()
        taken = Sample(
            at=self.store.clock_now().timestamp(),
            ready=jobs["ready"],
            pending=messages["pending"],
            completed=counters["jobs_completed"],
            sent=counters["sends_sent"],
        )
        with self._lock:
            if not self._samples or taken.at > self._samples[-1].at:
                self._samples.append(taken)
        return taken

    def series(self) -> dict[str, list[Any]]:
        """uPlot's columns: times, then one list per line. Rates are per minute between a
        sample and the one before it (the first sample has none)."""
        with self._lock:
            samples = list(self._samples)
        columns: dict[str, list[Any]] = {
            "t": [],
            "ready": [],
            "pending": [],
            "completed_per_min": [],
            "sent_per_min": [],
        }
        for before, sample in zip([None, *samples], samples, strict=False):
            columns["t"].append(sample.at)
            columns["ready"].append(sample.ready)
            columns["pending"].append(sample.pending)
            if before is None or sample.at <= before.at:
                columns["completed_per_min"].append(None)
                columns["sent_per_min"].append(None)
                continue
            minutes = (sample.at - before.at) / 60.0
            columns["completed_per_min"].append(
                round((sample.completed - before.completed) / minutes, 1)
            )
            columns["sent_per_min"].append(round((sample.sent - before.sent) / minutes, 1))
        return columns

    def run(self, stop: threading.Event, every_s: float = EVERY_S) -> None:
        while True:
            try:
                self.sample()
            except OnceboxError as exc:  # the store away: the gap shows on the chart
                log.warning("trend sample not taken: %s", exc)
            if stop.wait(every_s):
                return
