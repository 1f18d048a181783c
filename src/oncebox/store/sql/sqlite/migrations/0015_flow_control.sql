-- Flow control: a limited job's partition, a debounced job's key while it waits, the claim
-- index without limited jobs, and the limits' buckets; see PostgreSQL's 0015.
ALTER TABLE oncebox_jobs ADD COLUMN limit_key TEXT;
ALTER TABLE oncebox_jobs ADD COLUMN debounce_key TEXT;
DROP INDEX oncebox_jobs_claim;
CREATE INDEX oncebox_jobs_claim ON oncebox_jobs (priority DESC, run_at, id)
    WHERE state = 'ready' AND limit_key IS NULL;
CREATE INDEX oncebox_jobs_limited ON oncebox_jobs (task, limit_key, priority DESC, run_at, id)
    WHERE state = 'ready' AND limit_key IS NOT NULL;
CREATE INDEX oncebox_jobs_limited_leased ON oncebox_jobs (task, limit_key)
    WHERE state = 'leased' AND limit_key IS NOT NULL;
CREATE UNIQUE INDEX oncebox_jobs_debounce ON oncebox_jobs (debounce_key)
    WHERE state = 'ready' AND debounce_key IS NOT NULL;

CREATE TABLE oncebox_limits (
    name TEXT NOT NULL,
    partition TEXT NOT NULL,
    tokens REAL,
    updated_at INTEGER,
    PRIMARY KEY (name, partition)
) STRICT, WITHOUT ROWID;
