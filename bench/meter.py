"""What the server did during a phase of bench/storage.py, read from outside it: WAL (LSNs,
pg_stat_wal, pg_walinspect by record kind and relation), the cluster's CPU from /proc, the
statement time pg_stat_statements counted, and each table's row counters — all generic over the
schema the database holds (see bench/storage.py for what each figure means)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

# what this benchmark sets on the private cluster, as the shared server runs (autovacuum off),
# and so that no checkpoint lands in a phase (its full-page images would swamp the figures)
SETTINGS = {
    "autovacuum": "off",
    "checkpoint_timeout": "1h",
    "max_wal_size": "8GB",
    "wal_keep_size": "1GB",  # the phase's WAL stays on disk for pg_walinspect
}
BTREE_ENTRIES = {"INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R"}


def configure(admin: str) -> dict[str, str]:
    """Set SETTINGS (all reloadable) and create pg_walinspect in the admin database; returns
    the settings as a new connection sees them, with the server's version and fsync."""
    with psycopg.connect(admin, autocommit=True) as conn:
        for name, value in SETTINGS.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'".encode())
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    for _ in range(200):  # the postmaster rereads its files on SIGHUP, a moment later
        with psycopg.connect(admin, autocommit=True) as conn:
            seen = {n: str(conn.execute(f"SHOW {n}".encode()).fetchone()[0]) for n in SETTINGS}  # type: ignore[index]
            fsync = str(conn.execute("SHOW fsync").fetchone()[0])  # type: ignore[index]
            version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
        if seen["autovacuum"] == "off" and seen["checkpoint_timeout"] == "1h":
            return {**seen, "fsync": fsync, "server_version": version.split(maxsplit=1)[0]}
        time.sleep(0.05)  # a benchmark's wait for the reload, not a test's synchronisation
    raise SystemExit(f"storage: the cluster did not take the settings: {seen}")


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def postmaster_of(admin: str) -> int:
    """The postmaster's pid: the parent of a backend."""
    with psycopg.connect(admin, autocommit=True) as conn:  # read while the backend lives
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        fields = proc_stat(backend)
    if fields is None:
        raise SystemExit(f"storage: no /proc/{backend}/stat for the server's backend")
    return int(fields[1])


def server_ticks(postmaster: int) -> int:
    """User + system clock ticks of the whole cluster so far: the postmaster's own and its
    reaped children's (cutime + cstime), plus each living child's."""
    own = proc_stat(postmaster)
    if own is None:
        raise SystemExit(f"storage: the postmaster ({postmaster}) is gone")
    total = sum(int(f) for f in own[11:15])
    for entry in os.scandir("/proc"):
        if (
            entry.name.isdigit()
            and (fields := proc_stat(entry.name))
            and fields[1] == str(postmaster)
        ):
            total += sum(int(f) for f in fields[11:15])
    return total


TICK_US = 1_000_000 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Reading:
    lsn: str
    ticks: int
    wal_records: int
    wal_fpi: int
    checkpoints: int
    client_cpu_s: float
    at: float


class Meter:
    """Readings of one database's phases, from the admin database (not counted there)."""

    def __init__(self, admin: str, postmaster: int, database: str, url: str) -> None:
        self.admin, self.postmaster, self.database, self.url = admin, postmaster, database, url

    def quiet(self) -> None:
        """Until no client is connected to the database: a backend reports its counters to
        pg_stat_user_tables as it exits."""
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for _ in range(600):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                    (self.database,),
                ).fetchone()
                if row and row[0] == 0:
                    return
                time.sleep(0.05)  # a benchmark's wait for backends to exit
        raise SystemExit(f"storage: clients still connected to {self.database} after 30 s")

    def read(self) -> Reading:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT pg_current_wal_lsn()::text, w.wal_records, w.wal_fpi,"
                " b.checkpoints_timed + b.checkpoints_req"
                " FROM pg_stat_wal w, pg_stat_bgwriter b"
            ).fetchone()
        assert row is not None
        return Reading(
            lsn=row[0],
            ticks=server_ticks(self.postmaster),
            wal_records=int(row[1]),
            wal_fpi=int(row[2]),
            checkpoints=int(row[3]),
            client_cpu_s=time.process_time(),
            at=time.perf_counter(),
        )

    def tables(self) -> dict[str, dict[str, int]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
                " FROM pg_stat_user_tables"
            ).fetchall()
        return {
            str(r[0]): {"ins": int(r[1]), "upd": int(r[2]), "hot": int(r[3]), "del": int(r[4])}
            for r in rows
        }

    def relations(self) -> dict[int, str]:
        """relfilenode -> name of the database's tables and indexes (and their TOAST)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT c.relfilenode, coalesce(t.relname || ' (TOAST)', c.relname)"
                " FROM pg_class c LEFT JOIN pg_class t ON t.reltoastrelid = c.oid"
                " WHERE c.relfilenode <> 0"
            ).fetchall()
        return {int(r[0]): str(r[1]) for r in rows}

    def wal(self, start: str, end: str, jobs: int) -> dict[str, Any]:
        """The WAL between two LSNs by record kind and by relation (pg_walinspect)."""
        names = self.relations()
        with psycopg.connect(self.admin, autocommit=True) as conn:
            for _ in range(200):  # the WAL writer flushes asynchronous commits within 200 ms
                flushed = conn.execute(
                    "SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (end,)
                ).fetchone()
                if flushed and flushed[0]:
                    break
                time.sleep(0.05)
            rows = conn.execute(
                "SELECT resource_manager, record_type,"
                " (regexp_match(block_ref, 'rel \\d+/\\d+/(\\d+)'))[1]::oid AS rel,"
                " count(*), sum(record_length), sum(fpi_length)"
                " FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)"
                " GROUP BY 1, 2, 3",
                (start, end),
            ).fetchall()
        kinds: dict[str, dict[str, float]] = {}
        relations: dict[str, dict[str, float]] = {}
        entries: dict[str, float] = {}
        for manager, record, rel, count, length, fpi in rows:
            kind = kinds.setdefault(f"{manager}/{record}", {"records": 0, "bytes": 0})
            kind["records"] += count
            kind["bytes"] += int(length)
            name = names.get(int(rel), "(other)") if rel is not None else "(none)"
            relation = relations.setdefault(name, {"records": 0, "bytes": 0, "fpi_bytes": 0})
            relation["records"] += count
            relation["bytes"] += int(length)
            relation["fpi_bytes"] += int(fpi or 0)
            if manager == "Btree" and record in BTREE_ENTRIES:
                entries[name] = entries.get(name, 0) + count
        return {
            "wal_by_record": per_job_sorted(kinds, jobs),
            "wal_by_relation": per_job_sorted(relations, jobs),
            "index_entries": round(sum(entries.values()) / jobs, 3),
            "index_entries_by_index": {
                k: round(v / jobs, 3) for k, v in sorted(entries.items(), key=lambda kv: -kv[1])
            },
        }

    def statement_ms(self) -> float:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(s.total_exec_time), 0) FROM pg_stat_statements s"
                " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s AND s.toplevel",
                (self.database,),
            ).fetchone()
        return float(row[0]) if row else 0.0

    def reset_statements(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_statements_reset()")


def per_job_sorted(figures: dict[str, dict[str, float]], jobs: int) -> dict[str, dict[str, float]]:
    ordered = sorted(figures.items(), key=lambda kv: -kv[1]["bytes"])
    return {k: {f: round(v / jobs, 3) for f, v in fs.items()} for k, fs in ordered}


def lsn_bytes(admin: str, start: str, end: str) -> int:
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)
        ).fetchone()
    return int(row[0]) if row else 0


def table_figures(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], jobs: int
) -> dict[str, dict[str, float | None]]:
    """Per job, each table the phase wrote; hot_pct None where it updated nothing."""
    out: dict[str, dict[str, float | None]] = {}
    for name, counts in sorted(after.items()):
        old = before.get(name, {"ins": 0, "upd": 0, "hot": 0, "del": 0})
        delta = {k: counts[k] - old[k] for k in counts}
        if not any(delta.values()):
            continue
        out[name] = {
            "n_tup_ins": round(delta["ins"] / jobs, 3),
            "n_tup_upd": round(delta["upd"] / jobs, 3),
            "n_tup_hot_upd": round(delta["hot"] / jobs, 3),
            "n_tup_del": round(delta["del"] / jobs, 3),
            "hot_pct": round(100 * delta["hot"] / delta["upd"], 1) if delta["upd"] else None,
        }
    return out


def hot_pct(tables: dict[str, dict[str, float | None]], suffix: str) -> float | None:
    """ "Leases HOT %" of the table named `…suffix` (oncebox_jobs, the floor's jobs)."""
    named = [t for name, t in tables.items() if name == suffix or name.endswith("_" + suffix)]
    return named[0]["hot_pct"] if len(named) == 1 else None


def lsn(admin: str) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        return str(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
