"""The depths the triggers keep (`oncebox_depths`, migration 0010) against a count of the
tables: what they must always equal, whatever statement moved the rows."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg

KEPT = """
SELECT kind, name, queue, state, outcome, sum(value) FROM oncebox_depths
GROUP BY 1, 2, 3, 4, 5 HAVING sum(value) <> 0
"""
COUNTED = """
SELECT 'job', task, queue, state, COALESCE(outcome, ''), count(*) FROM oncebox_all_jobs
GROUP BY 2, 3, 4, 5
UNION ALL
SELECT 'message', channel, '', CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END,
       '', count(*) FROM oncebox_outbox
GROUP BY 2, 4
"""


def _read(url: str, sql: str) -> dict[tuple[Any, ...], int]:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            rows = conn.execute(sql).fetchall()
        finally:
            conn.close()
    else:
        base, _, schema = url.partition("?schema=")
        with psycopg.connect(base) as pg:
            pg.execute(f"SET search_path TO {schema or 'public'}".encode())
            rows = pg.execute(sql.encode()).fetchall()
    return {tuple(row[:-1]): int(row[-1]) for row in rows}


def depth_drift(url: str) -> dict[tuple[Any, ...], tuple[int, int]]:
    """Every (kind, name, queue, state, outcome) whose kept depth differs from the count:
    (kept, counted). Empty when the triggers kept up."""
    kept, counted = _read(url, KEPT), _read(url, COUNTED)
    return {
        key: (kept.get(key, 0), counted.get(key, 0))
        for key in kept.keys() | counted.keys()
        if kept.get(key, 0) != counted.get(key, 0)
    }
