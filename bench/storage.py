"""Storage per job: the WAL, server CPU and row writes each processed job costs (issue 47).

    .venv/bin/python bench/storage.py [--jobs 20000] [--repeat 3] [--size tiny|default]
                                      [--per-job] [--backlog] [--prune]
                                      [--small 10000] [--large 1000000] [--measure 10000]
                                      [--pg-bin DIR] [--json PATH]

Everything runs on a private PostgreSQL cluster (bench/idle.py's `private_cluster`: a temporary
directory, a free port, `pg_stat_statements` loaded, fsync off), set here as the shared benchmark
server runs — **autovacuum off** — with checkpoints held off (`checkpoint_timeout` 1 h,
`max_wal_size` 8 GB) so no checkpoint falls inside a measured phase and fills it with full-page
images. The figures are generic over the schema the store creates: every table of the fresh
database is read from `pg_stat_user_tables`, whatever its name (the readings: bench/meter.py).

`--per-job` (the default mode) runs, each on a fresh database, N jobs (`--jobs`):
- `noop`: oncebox's keyed no-op processing (bench/core.py's task, one worker until idle);
- `full`: oncebox's full guarantee path (bench/outbox.py's `work_full`: claim, outbox row,
  settlement; lease, send to the null provider, receipt);
- `floor_full`: the floor's full path (bench/floor.py, its own three-table schema);
- `floor_noop`: the floor's claim-and-mark-done, beside `noop`.
The load (enqueue or COPY, then ANALYZE, as autovacuum would) is outside the measured phase; its
WAL is reported apart (`enqueue_wal_bytes`: around the whole load, its ANALYZE's few KB
included). The phase runs from the processing's start until its connections have closed and
left the server (a backend sends its table counters when it exits; an idle one may hold them
for 10 s); `seconds` and `per_s` time the processing alone. Per job:
- `wal_bytes`: `pg_current_wal_lsn()` after minus before;
- `server_cpu_us`: user + system CPU of every process of the cluster (backends, WAL writer,
  checkpointer, …) from `/proc/<pid>/stat` — the postmaster's children alive at either reading,
  plus the postmaster's own `cutime + cstime`, where the CPU of a backend that exited in the
  phase goes (clock ticks, 10 ms each; the measuring connection is included, a few ms);
- `statement_ms` (total) and `statement_us`: the second figure, `pg_stat_statements`'
  `total_exec_time` of the database's top-level statements — the server's wall clock inside
  statements, waits for a core included;
- `wal_records`, `wal_fpi` (`pg_stat_wal`), and from `pg_walinspect` the phase's WAL records by
  kind and by relation (`wal_by_relation`: bytes and records per job of each table and index);
- `index_entries`: B-tree entries written per job, counted from the WAL (`INSERT_LEAF` +
  `INSERT_POST` + `SPLIT_L` + `SPLIT_R` records: each carries one new entry; the rare split of an
  upper level is counted too), in total and per index — exact, where an estimate from the
  indexes' predicates would have been an upper bound;
- `tables`: for each table written, `n_tup_ins`, `n_tup_upd`, `n_tup_hot_upd`, `n_tup_del` per
  job and `hot_pct` = HOT updates / updates; `jobs_hot_pct` and `outbox_hot_pct` are those of
  the tables named `…jobs` and `…outbox` ("leases HOT %").
`ratios` divides oncebox's figures by the floor's (full by floor_full, noop by floor_noop).
The runs repeat `--repeat` times, interleaved; each figure is the median of its rounds. The
machine's load average at the start and end is recorded: CPU and times move with it, the counts
(WAL, rows, index entries) hardly.

`--backlog` runs bench/backlog.py's oncebox measurement on the cluster: keyed no-op throughput
over the first `--measure` jobs of a `--large` backlog against a `--small` one.

`--prune`: two weeks of N finished keyed no-op jobs on the store's frozen clock (FrozenClock: the
history's weeks made at T first, `Store.job_history_tend`, as the pruner keeps four weeks ahead;
the first week's jobs finish at T, a Monday noon, the second's at T + 7 days; the clock then
stands at T + 14 days), loaded alike on two fresh databases, each then VACUUMed. The task keeps
its jobs 7 days: a retention of a week or more goes by week (the cutoff is the Monday 00:00 UTC
of the week holding now - 7 days, T + 7 days at midnight), so the first week is past it and the
second is not.
- on the first, the store's own job prune (`Store.prune("jobs", …)`, the Pruner lane's batch of
  1 000) loops until it removes no more — timed, with its WAL — then a timed VACUUM;
- on the second, the store's week drop (`Store.job_history_drop`, what the pruner runs before
  any batch) drops the first week's partition whole — timed, with its WAL; then, as the floor
  under it, the second week's partition is detached and dropped by hand (`raw`: no retention
  or message checks, no folding), timed.
Reported: both, and the ratios drop / (DELETE + VACUUM) and drop / DELETE (issue 47's target:
at most 0.01).

`--size tiny` is a seconds-long run for the test suite; the figures are written as JSON to
`--json` (default bench/results/storage.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import backlog
import floor
from core import analyse, noop_box, postgres_url
from idle import PG_BIN, ClusterUnavailable, private_cluster
from meter import (
    TICK_US,
    Meter,
    configure,
    hot_pct,
    lsn,
    lsn_bytes,
    postmaster_of,
    table_figures,
)
from outbox import make_box, work_full

import oncebox
from oncebox.kernel.clock import real_now
from oncebox.retention.policy import by_week
from oncebox.testing import FrozenClock

ROOT = Path(__file__).resolve().parents[1]
PRUNE_BATCH = 1000
# the pruned task's retention: at FROZEN_AT + 14 days the cutoff by week is the Monday of
# FROZEN_AT + 11 days, FROZEN_AT's next Monday — the first week is past it, the second not
PRUNE_KEEP = timedelta(days=7)  # a week or more: by week (retention/policy.py, by_week)
WEEK = timedelta(days=7)
# a Monday noon some weeks back: the first pruned week's jobs finish then
FROZEN_AT = datetime(2026, 10, 5, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Size:
    jobs: int
    small: int
    large: int
    measure: int
    repeat: int


SIZES = {
    "default": Size(jobs=20_000, small=10_000, large=1_000_000, measure=10_000, repeat=3),
    "tiny": Size(jobs=300, small=600, large=2_000, measure=300, repeat=1),
}


# -- one run: load, then the measured phase --------------------------------------------------


@contextmanager
def fresh(admin: str, oncebox_schema: bool) -> Iterator[tuple[str, str]]:
    """A fresh database of the cluster, migrated to oncebox's schema or not: (url, name)."""
    if oncebox_schema:
        with postgres_url(admin)() as url:
            yield url, url.rsplit("/", 1)[1]
        return
    with floor.fresh_database(admin) as url:
        yield url, psycopg.conninfo.conninfo_to_dict(url)["dbname"]  # type: ignore[misc]


Load = Callable[[str], None]
Process = Callable[[str], None]


def measure_run(
    admin: str, postmaster: int, jobs: int, *, oncebox_schema: bool, load: Load, process: Process
) -> dict[str, Any]:
    """`load(url)` (its WAL around the call, its connections closed by its end), then the
    phase: `process(url)` until its clients have left the server."""
    with fresh(admin, oncebox_schema) as (url, database):
        meter = Meter(admin, postmaster, database, url)
        meter.quiet()
        start = meter.read()
        load(url)
        loaded = meter.read()
        meter.quiet()
        tables_before = meter.tables()
        meter.reset_statements()
        before = meter.read()
        process(url)
        processed = time.perf_counter()  # `seconds`: the processing, not the wait below
        meter.quiet()
        after = meter.read()
        statement_ms = meter.statement_ms()
        tables = table_figures(tables_before, meter.tables(), jobs)
        wal = meter.wal(before.lsn, after.lsn, jobs)
    wal_bytes = lsn_bytes(admin, before.lsn, after.lsn)
    seconds = processed - before.at
    return {
        "jobs": jobs,
        "seconds": round(seconds, 3),
        "per_s": round(jobs / seconds),
        "wal_bytes": round(wal_bytes / jobs, 1),
        "enqueue_wal_bytes": round(lsn_bytes(admin, start.lsn, loaded.lsn) / jobs, 1),
        "server_cpu_us": round((after.ticks - before.ticks) * TICK_US / jobs, 1),
        "statement_us": round(1000 * statement_ms / jobs, 1),
        "statement_ms": round(statement_ms, 1),
        "client_cpu_us": round(1e6 * (after.client_cpu_s - before.client_cpu_s) / jobs, 1),
        "wal_records": round((after.wal_records - before.wal_records) / jobs, 2),
        "wal_fpi": round((after.wal_fpi - before.wal_fpi) / jobs, 3),
        "checkpoints_in_phase": after.checkpoints - before.checkpoints,
        "jobs_hot_pct": hot_pct(tables, "jobs"),
        "outbox_hot_pct": hot_pct(tables, "outbox"),
        "tables": tables,
        **wal,
    }


def oncebox_noop(jobs: int) -> tuple[Load, Process]:
    def load(url: str) -> None:
        box = noop_box(url, keyed=True)
        try:
            assert box.enqueue_many("noop", [{"n": i} for i in range(jobs)]).created == jobs
        finally:
            box.close()
        analyse(url)

    def process(url: str) -> None:
        box = noop_box(url, keyed=True)
        try:
            result = box.work(config=oncebox.WorkerConfig(until_idle=True))
            assert result.consumed.completed == jobs, result.consumed
        finally:
            box.close()

    return load, process


def oncebox_full(jobs: int) -> tuple[Load, Process]:
    def load(url: str) -> None:
        box = make_box(url, "null:")
        try:
            assert box.enqueue_many("mail", [{"n": i} for i in range(jobs)]).created == jobs
        finally:
            box.close()
        analyse(url)

    def process(url: str) -> None:
        box = make_box(url, "null:")
        try:
            work_full(box, jobs)
        finally:
            box.close()

    return load, process


def floor_full(jobs: int) -> tuple[Load, Process]:
    def load(url: str) -> None:
        floor.copy_jobs(url, jobs)  # COPY, then ANALYZE jobs

    def process(url: str) -> None:
        floor.lanes_concurrently(
            lambda start, written: floor.consume(url, floor.FULL, start, written),
            lambda done, written: floor.dispatch(url, jobs, done, written),
            jobs,
            "the full path",
        )
        floor.check_full(url, jobs)

    return load, process


def floor_noop(jobs: int) -> tuple[Load, Process]:
    def load(url: str) -> None:
        floor.copy_jobs(url, jobs)

    def process(url: str) -> None:
        done, _ = floor.consume(url, (floor.DONE,))
        assert done == jobs, (done, jobs)

    return load, process


RUNS: dict[str, tuple[bool, Callable[[int], tuple[Load, Process]]]] = {
    "noop": (True, oncebox_noop),
    "full": (True, oncebox_full),
    "floor_full": (False, floor_full),
    "floor_noop": (False, floor_noop),
}


def ratio(ours: float, theirs: float) -> float | None:
    return round(ours / theirs, 2) if theirs else None


def per_job(admin: str, postmaster: int, jobs: int, repeat: int = 1) -> dict[str, Any]:
    """Each run `repeat` times, the runs interleaved (a busy spell of the machine falls on all
    of them): each figure is the median of its rounds (`rounds` keeps them all); the tables and
    the WAL by kind and relation are the last round's."""
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNS}
    for _ in range(repeat):
        for name, (schema, make) in RUNS.items():
            load, process = make(jobs)
            figures = measure_run(
                admin, postmaster, jobs, oncebox_schema=schema, load=load, process=process
            )
            rounds[name].append(figures)
            print(f"storage: {name} done in {figures['seconds']} s", file=sys.stderr)
    runs: dict[str, Any] = {}
    for name, done in rounds.items():
        scalars = [k for k, v in done[-1].items() if isinstance(v, int | float)]
        runs[name] = {
            **done[-1],
            **{k: statistics.median(r[k] for r in done) for k in scalars},
            "rounds": [{k: r[k] for k in scalars} for r in done],
        }
    ratios = {
        f"{ours}/{theirs}": {
            f: ratio(runs[ours][f], runs[theirs][f])
            for f in ("wal_bytes", "server_cpu_us", "statement_us", "index_entries")
        }
        for ours, theirs in (("full", "floor_full"), ("noop", "floor_noop"))
    }
    return {**runs, "repeat": repeat, "ratios": ratios}


# -- the backlog and the prune --------------------------------------------------------------


def backlog_figures(admin: str, size: Size) -> dict[str, Any]:
    """bench/backlog.py's oncebox figure on this cluster (fresh statistics)."""
    small = backlog.measure_oncebox(admin, size.small, size.measure)
    large = backlog.measure_oncebox(admin, size.large, size.measure)
    return {
        "small": size.small,
        "large": size.large,
        "measure": size.measure,
        "small_per_s": round(small["process_per_s"]),
        "large_per_s": round(large["process_per_s"]),
        "ratio": round(large["process_per_s"] / small["process_per_s"], 2),
        "large_enqueue_s": round(large["enqueue_s"], 1),
        "detail": {"small": backlog.rounded(small), "large": backlog.rounded(large)},
    }


def two_weeks(url: str, jobs: int) -> None:
    """`jobs` keyed no-op jobs finished at FROZEN_AT, as many a week later; the clock is left
    at FROZEN_AT + 14 days (a lease lapses 30 s after this process lets go of it). The history's
    weeks are made first, at FROZEN_AT and four ahead (`Store.job_history_tend`, as the pruner
    keeps them): each job lands in its week's partition, not the default one."""
    box = noop_box(url, keyed=True)
    try:
        clock = FrozenClock(box, FROZEN_AT)
        try:
            box.store.job_history_tend(timedelta(weeks=4), 0)
            for week in range(2):
                args = [{"n": i} for i in range(week * jobs, (week + 1) * jobs)]
                assert box.enqueue_many("noop", args).created == jobs
                result = box.work(config=oncebox.WorkerConfig(until_idle=True))
                assert result.consumed.completed == jobs, result.consumed
                clock.advance(WEEK)
        finally:
            clock.release()
    finally:
        box.close()


def timed_sql(url: str, *statements: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        for sql in statements:
            conn.execute(sql.encode())
        return time.perf_counter() - started


def week_cutoff(now: datetime, keep: timedelta) -> datetime:
    """Retention by week (the pruner's `by_week`, job_history_drop): a job goes once the whole
    week it finished in is past `keep`, that is when it finished before the Monday 00:00 UTC of
    the week holding `now - keep`."""
    return now - by_week(keep, now)


def prune_figures(admin: str, jobs: int) -> dict[str, Any]:
    """The same two weeks on two fresh databases; on the first, the store's batched DELETE
    (`Store.prune`, the batches of the Pruner lane) removes the first week, then a VACUUM; on
    the second, the store's week drop (`Store.job_history_drop`, what the pruner runs first)
    removes it whole. Both timed, with their WAL; the ratio drop / (DELETE + VACUUM)."""
    now = FROZEN_AT + 2 * WEEK
    cutoff = week_cutoff(now, PRUNE_KEEP)
    # the first week is past retention by week, the second is not
    assert FROZEN_AT < cutoff <= FROZEN_AT + WEEK, cutoff
    delete = batched_delete(admin, jobs, now)
    if delete["pruned"] != jobs:
        print(
            f"storage: the prune removed {delete['pruned']} jobs, not the first week's {jobs}",
            file=sys.stderr,
        )
    drop = week_drop(admin, jobs, now)
    return {
        "jobs_per_week": jobs,
        "keep_days": PRUNE_KEEP / timedelta(days=1),
        "now": now.isoformat(),
        "cutoff": cutoff.isoformat(),
        **delete,
        "drop": drop,
        "drop_over_delete_and_vacuum": (
            round(drop["drop_s"] / delete["delete_and_vacuum_s"], 5)
            if drop.get("drop_s") is not None
            else None
        ),
        "drop_over_delete": (
            round(drop["drop_s"] / delete["delete_s"], 5)
            if drop.get("drop_s") is not None
            else None
        ),
    }


def batched_delete(admin: str, jobs: int, now: datetime) -> dict[str, Any]:
    """The first week pruned by the store's batches, then VACUUM: timed, with their WAL."""
    with postgres_url(admin)() as url:
        two_weeks(url, jobs)
        timed_sql(url, "VACUUM")  # the processing's dead rows, so the timed one is the prune's
        box = noop_box(url, keyed=True)
        clock = FrozenClock(box, now)  # this process holds it now
        try:
            box.store.prune_names("jobs")  # the pool's connection open before the timing
            before = lsn(admin)
            started, pruned = time.perf_counter(), 0
            # the pruner's batches: its retention stretched to the week (retention/policy.py)
            keep = by_week(PRUNE_KEEP, now)
            while batch := box.store.prune("jobs", "noop", keep, PRUNE_BATCH):
                pruned += batch
            delete_s = time.perf_counter() - started
            deleted = lsn(admin)
        finally:
            clock.release()
            box.close()
        vacuum_s = timed_sql(url, "VACUUM")
        vacuumed = lsn(admin)
        left = history_rows(url)
    return {
        "pruned": pruned,
        "left": left,
        "batch": PRUNE_BATCH,
        "delete_s": round(delete_s, 3),
        "delete_per_s": round(pruned / delete_s),
        "delete_wal_bytes": lsn_bytes(admin, before, deleted),
        "delete_wal_bytes_per_job": round(lsn_bytes(admin, before, deleted) / jobs, 1),
        "vacuum_s": round(vacuum_s, 3),
        "vacuum_wal_bytes_per_job": round(lsn_bytes(admin, deleted, vacuumed) / jobs, 1),
        "delete_and_vacuum_s": round(delete_s + vacuum_s, 3),
    }


def week_drop(admin: str, jobs: int, now: datetime) -> dict[str, Any]:
    """The first week dropped whole by the store (`job_history_drop`, the task's retention as
    the DELETE's): timed, with its WAL; the partition it held and its rows read before."""
    with postgres_url(admin)() as url:
        two_weeks(url, jobs)
        timed_sql(url, "VACUUM")
        oldest = oldest_partition(url)
        box = noop_box(url, keyed=True)
        clock = FrozenClock(box, now)
        try:
            box.store.prune_names("jobs")  # as the DELETE's: the connection open first
            before = lsn(admin)
            started = time.perf_counter()
            dropped = box.store.job_history_drop({"noop": PRUNE_KEEP}, None)
            seconds = time.perf_counter() - started
            after = lsn(admin)
        finally:
            clock.release()
            box.close()
        left = history_rows(url)
        gone = oldest is not None and not partition_exists(url, oldest["partition"])
        raw = raw_drop(admin, url)
    if dropped != jobs:
        print(f"storage: the week drop removed {dropped} jobs, not {jobs}", file=sys.stderr)
    wal = lsn_bytes(admin, before, after)
    return {
        **(oldest or {}),
        "dropped": dropped,
        "left": left,
        "partition_gone": gone,
        "drop_s": round(seconds, 5),
        "drop_wal_bytes": wal,
        "drop_wal_bytes_per_job": round(wal / jobs, 2),
        "raw": raw,
    }


def raw_drop(admin: str, url: str) -> dict[str, Any] | None:
    """The floor under the store's drop: the next week's partition (as many rows) detached and
    dropped by hand, with none of the store's checks (retention of each task, messages still to
    send) nor its folding (period summaries, depths, counters)."""
    oldest = oldest_partition(url)
    if oldest is None:
        return None
    before = lsn(admin)
    seconds = timed_sql(
        url,
        f"ALTER TABLE oncebox_job_history DETACH PARTITION {oldest['partition']}",
        f"DROP TABLE {oldest['partition']}",
    )
    return {
        **oldest,
        "drop_s": round(seconds, 5),
        "drop_wal_bytes": lsn_bytes(admin, before, lsn(admin)),
    }


def history_rows(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM oncebox_job_history").fetchone()
    assert row is not None
    return int(row[0])


def partition_exists(url: str, name: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def oldest_partition(url: str) -> dict[str, Any] | None:
    """The history's partition holding its oldest rows, with its row count; None without
    rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT tableoid::regclass::text, count(*) FROM oncebox_job_history"
            " GROUP BY 1 ORDER BY min(finished_at), 1 LIMIT 1"
        ).fetchone()
    if row is None:
        return None
    return {"partition": str(row[0]), "rows": int(row[1])}


# -- the report ----------------------------------------------------------------------------


def commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    )
    dirty = subprocess.run(
        # the code measured: tracked changes to src and bench, not the results being written
        [
            "git",
            "-C",
            str(ROOT),
            "status",
            "--porcelain",
            "--untracked-files=no",
            "--",
            "src",
            "bench",
            ":!bench/results",
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def show_per_job(figures: dict[str, Any]) -> None:
    names = [n for n in RUNS if n in figures]
    print(
        f"\nper job · {figures['noop']['jobs']:,} jobs · one fresh database each · "
        f"median of {figures['repeat']}"
    )
    print(f"{'':<34}" + "".join(f"{n:>12}" for n in names))
    rows = [
        ("WAL bytes (processing)", "wal_bytes"),
        ("WAL bytes (enqueue / COPY)", "enqueue_wal_bytes"),
        ("server CPU µs (/proc)", "server_cpu_us"),
        ("statement time µs (pg_stat_stmts)", "statement_us"),
        ("client CPU µs (this process)", "client_cpu_us"),
        ("WAL records", "wal_records"),
        ("WAL full-page images", "wal_fpi"),
        ("B-tree entries written", "index_entries"),
        ("jobs table updates HOT %", "jobs_hot_pct"),
        ("outbox table updates HOT %", "outbox_hot_pct"),
        ("jobs per second", "per_s"),
    ]
    for label, key in rows:
        cells = "".join(f"{'—' if figures[n][key] is None else figures[n][key]:>12}" for n in names)
        print(f"{label:<34}{cells}")
    for name in names:
        print(f"\n{name}: rows per job (ins / upd / HOT upd / del, HOT %)")
        for table, t in figures[name]["tables"].items():
            hot = "—" if t["hot_pct"] is None else f"{t['hot_pct']}%"
            print(
                f"  {table:<34}{t['n_tup_ins']:>8}{t['n_tup_upd']:>8}{t['n_tup_hot_upd']:>8}"
                f"{t['n_tup_del']:>8}{hot:>8}"
            )
        top = list(figures[name]["index_entries_by_index"].items())
        print("  B-tree entries per job: " + ", ".join(f"{k} {v}" for k, v in top))
    for pair, r in figures["ratios"].items():
        print(f"\n{pair}: " + ", ".join(f"{k} {v}x" for k, v in r.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument("--jobs", type=int, help="jobs per run (and per pruned week)")
    parser.add_argument("--per-job", action="store_true", help="the default when no mode is given")
    parser.add_argument("--backlog", action="store_true")
    parser.add_argument("--prune", action="store_true")
    parser.add_argument("--small", type=int)
    parser.add_argument("--large", type=int)
    parser.add_argument("--measure", type=int)
    parser.add_argument("--repeat", type=int, help="rounds of the per-job runs (median)")
    parser.add_argument("--pg-bin", type=Path, default=PG_BIN)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "storage.json")
    args = parser.parse_args(argv)
    base = SIZES[args.size]
    size = Size(
        jobs=args.jobs or base.jobs,
        small=args.small or base.small,
        large=args.large or base.large,
        measure=args.measure or base.measure,
        repeat=args.repeat or base.repeat,
    )
    if not 0 < size.measure <= min(size.small, size.large):
        parser.error("--measure must be positive and at most both backlog sizes")
    per = args.per_job or not (args.backlog or args.prune)
    report: dict[str, Any] = {
        "date": real_now().isoformat(timespec="seconds"),
        "commit": commit(),
        "oncebox": oncebox.__version__,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "size": args.size,
        "jobs": size.jobs,
        # how busy the machine was (2 cores shared with other work): CPU figures move with it
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        with private_cluster(args.pg_bin) as admin:
            report["cluster"] = configure(admin)
            print(f"storage: private cluster {report['cluster']}", file=sys.stderr)
            postmaster = postmaster_of(admin)
            if per:
                report["per_job"] = per_job(admin, postmaster, size.jobs, size.repeat)
                show_per_job(report["per_job"])
            if args.backlog:
                report["backlog"] = backlog_figures(admin, size)
                b = report["backlog"]
                print(
                    f"\nbacklog: first {b['measure']:,} keyed no-op jobs of {b['small']:,}: "
                    f"{b['small_per_s']:,}/s; of {b['large']:,}: {b['large_per_s']:,}/s "
                    f"(large / small {b['ratio']}x)"
                )
            if args.prune:
                report["prune"] = prune_figures(admin, size.jobs)
                p, d = report["prune"], report["prune"]["drop"]
                print(
                    f"\nprune one week ({p['pruned']:,} jobs, keep {p['keep_days']:g} days, "
                    f"cutoff {p['cutoff']}): batched DELETE {p['delete_s']} s "
                    f"({p['delete_per_s']:,}/s, {p['delete_wal_bytes_per_job']} WAL bytes/job) "
                    f"+ VACUUM {p['vacuum_s']} s"
                )
                print(
                    f"  week drop ({d.get('partition')}, {d['dropped']:,} jobs): {d['drop_s']} s, "
                    f"{d['drop_wal_bytes']:,} WAL bytes; drop / (DELETE + VACUUM) "
                    f"{p['drop_over_delete_and_vacuum']}, drop / DELETE {p['drop_over_delete']}"
                )
                if d["raw"] is not None:
                    print(
                        f"  by hand, DETACH + DROP of the next week ({d['raw']['rows']:,} rows): "
                        f"{d['raw']['drop_s']} s, {d['raw']['drop_wal_bytes']:,} WAL bytes"
                    )
    except ClusterUnavailable as exc:
        print(f"storage: no private cluster to measure on: {exc}", file=sys.stderr)
        return 1
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nstorage: written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
