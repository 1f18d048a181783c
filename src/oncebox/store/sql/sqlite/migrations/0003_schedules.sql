-- Schedules (see the PostgreSQL migration). Instants are microseconds.

CREATE TABLE oncebox_schedules (
    name TEXT PRIMARY KEY,
    paused INTEGER NOT NULL DEFAULT 0,
    last_fire_at INTEGER,
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE oncebox_schedule_runs (
    schedule TEXT NOT NULL,
    period TEXT NOT NULL,
    fire_at INTEGER,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')),
    owner TEXT,
    lease_expires_at INTEGER,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    scans INTEGER NOT NULL DEFAULT 0,
    eligible_count INTEGER,
    enqueued_count INTEGER NOT NULL DEFAULT 0,
    late INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (schedule, period)
) STRICT;
CREATE INDEX oncebox_schedule_runs_running ON oncebox_schedule_runs (schedule)
    WHERE state = 'running';
