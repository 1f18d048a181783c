-- Operations (see the PostgreSQL migration). Instants are microseconds.

ALTER TABLE oncebox_jobs ADD COLUMN schedule TEXT;
ALTER TABLE oncebox_jobs ADD COLUMN period TEXT;
CREATE INDEX oncebox_jobs_schedule_period ON oncebox_jobs (schedule, period)
    WHERE schedule IS NOT NULL;
CREATE INDEX oncebox_outbox_job ON oncebox_outbox (job_id);

CREATE TABLE oncebox_key_canaries (
    kind TEXT NOT NULL CHECK (kind IN ('task', 'schedule')),
    name TEXT NOT NULL,
    source TEXT NOT NULL,
    outputs TEXT NOT NULL,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (kind, name)
) STRICT;
