"""The one place that reads the wall clock.

Business time (leases, due times, backoffs, periods) is the *database's* time, read in SQL through
`oncebox_now()`: hosts' clocks drift, the database's is one for every worker. Tests and the chaos
harness freeze or offset that time through a setting every process of a run shares — a one-row
table on PostgreSQL, a small file beside the database on SQLite (a table would need SQLite's single
write lock, which a paused worker may hold). Python code that needs business time asks the store
(`Store.clock_now`), so it sees the same instant as SQL.

Monotonic time is for pacing loops and bounding handler run time; it is never written to the
database. Nothing outside this module calls `datetime.now()`, `time.time()` or `time.sleep()` (a
test enforces it).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Clock(Protocol):
    """Business time plus monotonic pacing; injected wherever code needs either."""

    def now(self) -> datetime:
        """The current business instant, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, never going backwards; for durations only."""
        ...


def real_now() -> datetime:
    """The host's wall clock, aware UTC. Only stores and `SystemClock` call this."""
    return datetime.now(UTC)


def monotonic() -> float:
    """Monotonic seconds, for bounding run times and pacing loops."""
    return time.monotonic()


def sleep(seconds: float) -> None:
    """Block the calling thread; prefer `threading.Event.wait` where a stop signal exists."""
    time.sleep(seconds)


class SystemClock:
    """The host's clock. Used where no store is involved (key rendering, CLI parsing)."""

    def now(self) -> datetime:
        return real_now()

    def monotonic(self) -> float:
        return monotonic()


def to_micros(instant: datetime) -> int:
    """Microseconds since the Unix epoch: SQLite's storage format for instants (exact, sortable)."""
    if instant.tzinfo is None:
        raise ValueError(f"naive datetime {instant.isoformat()} where an aware one is required")
    delta = instant - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The inverse of `to_micros`."""
    return EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True)
class ClockSetting:
    """What `oncebox_now()` returns: the real time, a frozen instant, or the real time + offset."""

    frozen_at: datetime | None = None
    offset: timedelta | None = None

    def __post_init__(self) -> None:
        if self.frozen_at is not None and self.offset is not None:
            raise ValueError("a clock setting is frozen or offset, not both")
        if self.frozen_at is not None and self.frozen_at.tzinfo is None:
            raise ValueError("the frozen instant must be timezone-aware")

    @property
    def is_real(self) -> bool:
        return self.frozen_at is None and self.offset is None

    def resolve(self, real: datetime) -> datetime:
        if self.frozen_at is not None:
            return self.frozen_at
        if self.offset is not None:
            return real + self.offset
        return real


class ClockFile:
    """The SQLite store's shared clock setting: `<database>.clock`, JSON, replaced atomically.

    Read on every `oncebox_now()` call while it exists (a missing file costs one failed `stat`), so
    a harness that rewrites it moves every process's time at once, with no caching to go stale.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> ClockSetting:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return ClockSetting()
        data = json.loads(raw)
        if "frozen_us" in data:
            return ClockSetting(frozen_at=from_micros(int(data["frozen_us"])))
        if "offset_us" in data:
            return ClockSetting(offset=timedelta(microseconds=int(data["offset_us"])))
        return ClockSetting()

    def write(self, setting: ClockSetting) -> None:
        if setting.is_real:
            self.path.unlink(missing_ok=True)
            return
        if setting.frozen_at is not None:
            data = {"frozen_us": to_micros(setting.frozen_at)}
        else:
            assert setting.offset is not None
            data = {"offset_us": setting.offset // timedelta(microseconds=1)}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def now_micros(self) -> int:
        """`oncebox_now()` for SQLite: integer microseconds since the epoch."""
        return to_micros(self.read().resolve(real_now()))
