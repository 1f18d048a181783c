-- Durable counters; see PostgreSQL's 0008. SQLite has one writer at a time, so one shard (0).
CREATE TABLE oncebox_counters (
    name TEXT NOT NULL,
    shard INTEGER NOT NULL,
    value INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, shard)
) STRICT, WITHOUT ROWID;
