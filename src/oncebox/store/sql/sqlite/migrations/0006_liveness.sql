-- What "nothing eligible is lost" needs from the schema; see PostgreSQL's 0006. SQLite's test
-- clock is a file beside the database (clock.ClockFile), which records its owner and expiry.

-- Outbox rows count the leases that expired on them without a send being recorded.
ALTER TABLE oncebox_outbox ADD COLUMN rescues INTEGER NOT NULL DEFAULT 0;

-- The live workers, with the tasks, queues and channels they serve (JSON arrays).
CREATE TABLE oncebox_workers (
    name TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    tasks TEXT NOT NULL,
    queues TEXT NOT NULL,
    channels TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    seen_at INTEGER NOT NULL,
    stopped_at INTEGER
);
