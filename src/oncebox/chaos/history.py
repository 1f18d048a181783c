"""The history of a chaos run: every operation a process invoked, and how it ended.

As in Jepsen, an operation is written down *before* it is attempted (`invoke`) and again when
its outcome is known (`ok`, `fail`, or `unknown` when the process cannot tell). A process killed
in between leaves an `invoke` with no completion: that operation's outcome is unknown too, and the
checker must allow it to have happened or not. Each process appends to its own file, flushed line
by line, so a SIGKILL loses at most the line being written and never another process's history.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Phase = Literal["invoke", "ok", "fail", "unknown"]


@dataclass(frozen=True)
class Event:
    op: str  # "send", "enqueue", "replay", "fault"
    phase: Phase
    key: str  # the operation's subject: an outbox token, a business key, a worker
    worker: str
    seed: int
    detail: str = ""


class HistoryWriter:
    """Appends one process's events to `<dir>/history-<pid>.jsonl`, one `write` per event.

    The history is the harness's record, not a victim of the faults it injects: while the
    process cannot write (the disk the harness filled for it), events wait in memory and go out
    with the next write that succeeds."""

    def __init__(self, folder: Path, worker: str, seed: int) -> None:
        self.worker, self.seed = worker, seed
        path = folder / f"history-{os.getpid()}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._waiting: list[bytes] = []
        self._lock = threading.Lock()

    def write(self, op: str, phase: Phase, key: str, detail: str = "") -> None:
        event = Event(op, phase, key, self.worker, self.seed, detail)
        with self._lock:
            self._waiting.append((json.dumps(asdict(event)) + "\n").encode())
            self._flush()

    def _flush(self) -> None:
        while self._waiting:
            try:
                os.write(self._fd, self._waiting[0])
            except OSError:  # EFBIG, ENOSPC: later
                return
            self._waiting.pop(0)

    def close(self) -> None:
        with self._lock:
            self._flush()
            os.close(self._fd)


def read_history(folder: Path) -> list[Event]:
    """Every process's events; a torn last line (a process killed mid-write) is skipped."""
    events: list[Event] = []
    for path in sorted(folder.glob("history-*.jsonl")):
        for line in path.read_text("utf-8").splitlines():
            try:
                events.append(Event(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    return events


@dataclass(frozen=True)
class SendOutcomes:
    """Per outbox token: how many sends were invoked, and how many ended unknown (an ambiguous
    answer, or a process that died before writing the outcome down)."""

    invoked: dict[str, int]
    unknown: dict[str, int]


def send_outcomes(events: Iterable[Event]) -> SendOutcomes:
    invoked: dict[str, int] = {}
    completed: dict[str, int] = {}
    unknown: dict[str, int] = {}
    for event in events:
        if event.op != "send":
            continue
        if event.phase == "invoke":
            invoked[event.key] = invoked.get(event.key, 0) + 1
        else:
            completed[event.key] = completed.get(event.key, 0) + 1
            if event.phase == "unknown":
                unknown[event.key] = unknown.get(event.key, 0) + 1
    for key, count in invoked.items():
        never_completed = count - completed.get(key, 0)
        if never_completed > 0:
            unknown[key] = unknown.get(key, 0) + never_completed
    return SendOutcomes(invoked, unknown)
