-- The outbox (see the PostgreSQL migration for the column notes). Instants are microseconds.

CREATE TABLE oncebox_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    intent_key TEXT NOT NULL,
    channel TEXT NOT NULL,
    payload TEXT NOT NULL,
    token TEXT NOT NULL,
    job_id INTEGER,
    state TEXT NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'leased', 'sending', 'sent', 'dead', 'ambiguous')),
    attempt INTEGER NOT NULL DEFAULT 0,
    attempt_base INTEGER NOT NULL DEFAULT 0,
    possible_duplicates INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    first_leased_at INTEGER,
    uncertain INTEGER NOT NULL DEFAULT 0,
    leased_by TEXT,
    leased_at INTEGER,
    lease_token TEXT,
    lease_expires_at INTEGER,
    sent_at INTEGER,
    receipt TEXT,
    last_error TEXT,
    CHECK ((state IN ('leased', 'sending')) = (lease_token IS NOT NULL))
) STRICT;

CREATE INDEX oncebox_outbox_due ON oncebox_outbox (channel, next_attempt_at, id)
    WHERE state = 'pending';
CREATE INDEX oncebox_outbox_leased ON oncebox_outbox (lease_expires_at)
    WHERE state IN ('leased', 'sending');
CREATE INDEX oncebox_outbox_intent ON oncebox_outbox (intent_key);
CREATE INDEX oncebox_outbox_attention ON oncebox_outbox (id) WHERE state IN ('dead', 'ambiguous');

CREATE TABLE oncebox_delivery_attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    outbox_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    worker TEXT,
    started_at INTEGER,
    finished_at INTEGER NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN
        ('sent', 'failed', 'throttled', 'dead', 'ambiguous', 'resent', 'lease_expired')),
    error TEXT,
    receipt TEXT
) STRICT;
CREATE INDEX oncebox_delivery_attempts_row ON oncebox_delivery_attempts (outbox_id, id);

CREATE TABLE oncebox_rate_buckets (
    channel TEXT NOT NULL,
    name TEXT NOT NULL,
    capacity REAL NOT NULL CHECK (capacity >= 1),
    refill_per_s REAL NOT NULL CHECK (refill_per_s > 0),
    tokens REAL NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (channel, name)
) STRICT;

CREATE TABLE oncebox_channel_pauses (
    channel TEXT PRIMARY KEY,
    paused_until INTEGER NOT NULL,
    reason TEXT NOT NULL
) STRICT;

CREATE TABLE oncebox_settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
