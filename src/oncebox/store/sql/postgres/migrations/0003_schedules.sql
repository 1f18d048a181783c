-- Schedules: per-schedule state (paused, the last fire time handled) and one row per
-- (schedule, period) fan-out, with an owner and a lease, so however many schedulers run, each
-- period is fanned out by one at a time and a dead owner's run is taken over.

CREATE TABLE __S__.oncebox_schedules (
    name text PRIMARY KEY,
    paused boolean NOT NULL DEFAULT false,
    last_fire_at timestamptz,
    updated_at timestamptz NOT NULL
);

CREATE TABLE __S__.oncebox_schedule_runs (
    schedule text NOT NULL,
    period text NOT NULL,
    fire_at timestamptz,
    state text NOT NULL CHECK (state IN ('running', 'done')),
    owner text,
    lease_expires_at timestamptz,
    started_at timestamptz NOT NULL,
    finished_at timestamptz,
    -- completed eligibility scans; the latest one's count is the period's coverage denominator
    scans integer NOT NULL DEFAULT 0,
    eligible_count bigint,
    enqueued_count bigint NOT NULL DEFAULT 0,
    late boolean NOT NULL DEFAULT false,
    PRIMARY KEY (schedule, period)
);
CREATE INDEX oncebox_schedule_runs_running ON __S__.oncebox_schedule_runs (schedule)
    WHERE state = 'running';
