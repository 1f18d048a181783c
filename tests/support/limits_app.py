"""A box with limited tasks, for tests that run it in several worker processes.

Each handler keeps a count of the handlers running at once in a file beside the database
(under an exclusive lock, so processes share it) and notes, as it starts, how many of its task's
jobs the store holds leased, in all and per partition. On PostgreSQL, where handlers of several
workers do run at once, a handler waits (up to a deadline) until as many are running as the
limit allows: if the limit let more in, the count would show it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from oncebox import Box, Concurrency, Debounce, JobContext, Rate, WorkerConfig
from support.db import sql

GLOBAL, PER_TENANT = 3, 1
WAIT_FOR_PEERS_S = 5.0


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read()
        state: dict[str, Any] = json.loads(text) if text else {}
        state.setdefault("running", {})
        state.setdefault("peak", {})
        state.setdefault("leased_peak", {})
        state.setdefault("runs", 0)
        yield state
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(state))


def read_counts(path: Path) -> dict[str, Any]:
    with _locked(path) as state:
        return dict(state)


def limited_box(url: str, counts: Path, *, together: int) -> Box:
    """`export` may run 3 at once in all and 1 per tenant; `together` is how many handlers one
    waits to see running before it returns (1 where handlers cannot overlap: SQLite)."""
    box = Box(url)

    @box.task(
        key="export/{tenant}/{n}",
        partition="{tenant}",
        limits=[Concurrency(GLOBAL), Concurrency(PER_TENANT, per_partition=True)],
    )
    def export(ctx: JobContext, tenant: str, n: int) -> None:
        leased = sql(
            box,
            "SELECT limit_key, count(*) FROM oncebox_all_jobs WHERE state = 'leased' "
            "AND task = 'export' GROUP BY limit_key",
        )
        with _locked(counts) as state:
            running, peak = state["running"], state["peak"]
            for name in ("all", tenant):
                running[name] = running.get(name, 0) + 1
                peak[name] = max(peak.get(name, 0), running[name])
            seen = state["leased_peak"]
            seen["all"] = max(seen.get("all", 0), sum(int(n) for _, n in leased))
            for partition, count in leased:
                seen[partition] = max(seen.get(partition, 0), int(count))
            state["runs"] += 1
        # wait until as many run as may: the limit, or fewer tenants have jobs left (a deadline
        # ends the wait if workers were slow to come: the counts then show less overlap)
        pause = threading.Event()
        for _ in range(int(WAIT_FOR_PEERS_S / 0.01)):
            [(tenants,)] = sql(
                box,
                "SELECT count(DISTINCT limit_key) FROM oncebox_all_jobs WHERE task = 'export' "
                "AND state IN ('ready', 'leased')",
            )
            if read_counts(counts)["running"].get("all", 0) >= min(together, int(tenants)):
                break
            pause.wait(0.01)
        with _locked(counts) as state:
            for name in ("all", tenant):
                state["running"][name] -= 1

    @box.task(key="ping/{n}", limits=[Rate("5/s")])
    def ping(ctx: JobContext, n: int) -> None:
        pass

    @box.task(debounce=Debounce(timedelta(seconds=30), by="{customer}"))
    def preview(ctx: JobContext, customer: int, edit: int) -> None:
        pass

    return box


def enqueue_burst(url: str, counts: str, edits: list[int], barrier: Any) -> None:
    """Enqueue one edit after another for customer 1, starting with the other racers."""
    box = limited_box(url, Path(counts), together=1)
    try:
        barrier.wait(30)
        for edit in edits:
            box.enqueue("preview", customer=1, edit=edit)
    finally:
        box.close()


def work_limited(url: str, counts: str, together: int) -> None:
    """A worker process: run until nothing is left."""
    box = limited_box(url, Path(counts), together=together)
    try:
        box.work(config=WorkerConfig(until_idle=True, poll_interval=timedelta(seconds=0.2)))
    finally:
        box.close()


def hold_slot(url: str, inside: Any) -> None:
    """Lease the one slot of `report` and stop inside its handler until this process is
    killed."""
    box = Box(url)

    @box.task(key="report/{n}", limits=[Concurrency(1)])
    def report(ctx: JobContext, n: int) -> None:
        inside.set()
        signal.pause()  # until SIGKILL

    box.consumer(name="holder").run_once()
    os._exit(3)  # unreachable unless the handler returned


RATE = 20  # the rate test's "20/s": a bucket of 20, refilled at 20 a second


def rate_box(url: str) -> Box:
    box = Box(url)

    @box.task(key="call/{n}", limits=[Rate(f"{RATE}/s")])
    def call(ctx: JobContext, n: int) -> None:
        pass

    return box


def work_rated(url: str) -> None:
    """A worker process: run the rate-limited task until nothing is left."""
    box = rate_box(url)
    try:
        box.work(config=WorkerConfig(until_idle=True, poll_interval=timedelta(seconds=0.2)))
    finally:
        box.close()
