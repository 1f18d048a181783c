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

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, replace
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


def process_owner() -> str:
    """Who this process is, as a clock setting records its owner: host and pid (read when
    asked, so a forked child is itself)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ClockSetting:
    """What `oncebox_now()` returns: the real time, a frozen instant, or the real time + offset.

    A frozen or offset setting belongs to the process that wrote it (`owner`) and, when written
    through a `ClockLease`, lapses at `expires_at` (the real time) unless its owner renews it:
    a test or a demo killed while it held the clock cannot leave a deployment on frozen time.
    `lapsed` is filled in by the store that read it. A setting without `expires_at` never lapses
    (tests that set the clock directly); a worker refuses it all the same (see
    `lanes.worker.refuse_foreign_clock`)."""

    frozen_at: datetime | None = None
    offset: timedelta | None = None
    owner: str | None = None
    expires_at: datetime | None = None
    lapsed: bool = False

    def __post_init__(self) -> None:
        if self.frozen_at is not None and self.offset is not None:
            raise ValueError("a clock setting is frozen or offset, not both")
        if self.frozen_at is not None and self.frozen_at.tzinfo is None:
            raise ValueError("the frozen instant must be timezone-aware")

    @property
    def is_real(self) -> bool:
        """Whether `oncebox_now()` is the real time: nothing set, or a setting that lapsed."""
        return (self.frozen_at is None and self.offset is None) or self.lapsed

    @property
    def foreign(self) -> bool:
        """Set by another process than this one."""
        return self.owner != process_owner()

    def resolve(self, real: datetime) -> datetime:
        if self.is_real:
            return real
        if self.frozen_at is not None:
            return self.frozen_at
        assert self.offset is not None
        return real + self.offset

    def describe(self) -> str:
        """One line for people: what the clock is, who set it, until when."""
        if self.frozen_at is None and self.offset is None:
            return "real"
        what = (
            f"frozen at {self.frozen_at.isoformat(timespec='seconds')}"
            if self.frozen_at is not None
            else f"offset by {self.offset}"
        )
        who = f" by {self.owner}" if self.owner else ""
        if self.lapsed:
            lapsed = self.expires_at.isoformat(timespec="seconds") if self.expires_at else "?"
            return f"real (a setting {what}{who} lapsed at {lapsed})"
        until = (
            f", lapses at {self.expires_at.isoformat(timespec='seconds')} unless renewed"
            if self.expires_at is not None
            else ", never lapses"
        )
        return f"{what}{who}{until}"


class ClockFile:
    """The SQLite store's shared clock setting: `<database>.clock`, JSON, replaced atomically.

    Read on every `oncebox_now()` call while it exists (a missing file costs one failed `stat`), so
    a harness that rewrites it moves every process's time at once, with no caching to go stale.
    A setting past its `expires_us` is read as lapsed: real time, without anyone deleting it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> ClockSetting:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return ClockSetting()
        data = json.loads(raw)
        expires = from_micros(int(data["expires_us"])) if "expires_us" in data else None
        common = {
            "owner": data.get("owner"),
            "expires_at": expires,
            "lapsed": expires is not None and expires <= real_now(),
        }
        if "frozen_us" in data:
            return ClockSetting(frozen_at=from_micros(int(data["frozen_us"])), **common)
        if "offset_us" in data:
            return ClockSetting(offset=timedelta(microseconds=int(data["offset_us"])), **common)
        return ClockSetting()

    def write(self, setting: ClockSetting) -> None:
        if setting.frozen_at is None and setting.offset is None:
            self.path.unlink(missing_ok=True)
            return
        data: dict[str, object] = {"owner": setting.owner or process_owner()}
        if setting.frozen_at is not None:
            data["frozen_us"] = to_micros(setting.frozen_at)
        else:
            assert setting.offset is not None
            data["offset_us"] = setting.offset // timedelta(microseconds=1)
        if setting.expires_at is not None:
            data["expires_us"] = to_micros(setting.expires_at)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def now_micros(self) -> int:
        """`oncebox_now()` for SQLite: integer microseconds since the epoch."""
        return to_micros(self.read().resolve(real_now()))


class ClockStore(Protocol):
    def clock_set(self, setting: ClockSetting) -> None: ...


DEFAULT_LEASE = timedelta(seconds=30)


def lease_from_environment() -> timedelta:
    """How long a test clock outlives its owner: `ONCEBOX_CLOCK_LEASE` seconds (default 30)."""
    raw = os.environ.get("ONCEBOX_CLOCK_LEASE")
    if not raw:
        return DEFAULT_LEASE
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0.5 <= seconds <= 86_400:
        raise ValueError(f"ONCEBOX_CLOCK_LEASE={raw!r}: give seconds between 0.5 and 86400")
    return timedelta(seconds=seconds)


class ClockLease:
    """Hold a frozen or offset clock for as long as this process lives.

    Every setting it writes carries this process as owner and an expiry `lease` from now; a
    thread renews it every third of the lease. When the owner stops — `release()`, or killed
    with no chance to clean up — the setting lapses by itself within `lease`, and every process
    of the deployment is back on real time."""

    def __init__(self, store: ClockStore, lease: timedelta | None = None) -> None:
        self.store = store
        self.lease = lease or lease_from_environment()
        self._setting: ClockSetting | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, frozen_at: datetime | None = None, offset: timedelta | None = None) -> None:
        with self._lock:
            self._setting = ClockSetting(frozen_at=frozen_at, offset=offset, owner=process_owner())
            self._write()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._renew, name="oncebox-clock-lease", daemon=True
            )
            self._thread.start()

    def _write(self) -> None:
        assert self._setting is not None
        expires = real_now() + self.lease
        self.store.clock_set(replace(self._setting, expires_at=expires))

    def _renew(self) -> None:
        while not self._stop.wait(self.lease.total_seconds() / 3):
            with self._lock:
                if self._setting is None:
                    return
                # the store is away: try again next time; meanwhile the lease may lapse, which
                # is the safe side (real time)
                with contextlib.suppress(Exception):
                    self._write()

    def release(self) -> None:
        """Back to real time, for every process."""
        self._stop.set()
        with self._lock:
            self._setting = None
            self.store.clock_set(ClockSetting())
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
