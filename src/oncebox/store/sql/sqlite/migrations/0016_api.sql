-- The HTTP API's keys and Idempotency-Key records; see PostgreSQL's 0017 (SQLite has no 0016 of
-- PostgreSQL's: broker-held queues record their jobs on PostgreSQL only).
CREATE TABLE oncebox_api_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: buckets and records name it
    name TEXT NOT NULL UNIQUE,
    scopes TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL,
    rate TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER
) STRICT;

CREATE TABLE oncebox_api_requests (
    api_key_id INTEGER NOT NULL REFERENCES oncebox_api_keys (id),
    idempotency_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    claim TEXT NOT NULL,
    status INTEGER,
    response TEXT,
    started_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (api_key_id, idempotency_key)
) STRICT, WITHOUT ROWID;
CREATE INDEX oncebox_api_requests_expiry ON oncebox_api_requests (expires_at);
