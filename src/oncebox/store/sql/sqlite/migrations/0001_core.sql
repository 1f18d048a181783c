-- oncebox core for SQLite: jobs and their attempts, intents (one per business key, forever) and
-- the audit log. Instants are INTEGER microseconds since the Unix epoch (UTC): exact, sortable,
-- and cheap to add durations to. The shared test clock is a file beside the database, not a
-- table (a table would need the single write lock a paused worker may hold).

CREATE TABLE oncebox_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,   -- AUTOINCREMENT: ids are never reused after pruning
    key TEXT,
    task TEXT NOT NULL,
    queue TEXT NOT NULL,
    args TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'ready'
        CHECK (state IN ('ready', 'leased', 'done', 'dead', 'cancelled')),
    outcome TEXT CHECK (outcome IN ('completed', 'duplicate')),
    priority INTEGER NOT NULL DEFAULT 0,
    group_key TEXT,
    attempt INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL CHECK (max_attempts >= 1),
    attempt_base INTEGER NOT NULL DEFAULT 0,
    run_at INTEGER NOT NULL,
    expires_at INTEGER,
    created_at INTEGER NOT NULL,
    leased_by TEXT,
    leased_at INTEGER,
    lease_token TEXT,
    lease_expires_at INTEGER,
    finished_at INTEGER,
    last_error TEXT,
    CHECK ((state = 'leased') = (lease_token IS NOT NULL)),
    CHECK ((outcome IS NOT NULL) = (state = 'done'))
) STRICT;

-- At most one job per key that is not cancelled (see the PostgreSQL migration for why done
-- jobs count).
CREATE UNIQUE INDEX oncebox_jobs_one_per_key ON oncebox_jobs (key)
    WHERE state <> 'cancelled';
CREATE INDEX oncebox_jobs_claim ON oncebox_jobs (priority DESC, run_at, id) WHERE state = 'ready';
CREATE INDEX oncebox_jobs_due ON oncebox_jobs (run_at) WHERE state = 'ready';
CREATE INDEX oncebox_jobs_leased ON oncebox_jobs (lease_expires_at) WHERE state = 'leased';
CREATE INDEX oncebox_jobs_group ON oncebox_jobs (queue, group_key, id)
    WHERE group_key IS NOT NULL AND state IN ('ready', 'leased');
CREATE INDEX oncebox_jobs_dead ON oncebox_jobs (id) WHERE state = 'dead';

CREATE TABLE oncebox_job_attempts (
    job_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    worker TEXT,
    started_at INTEGER,
    finished_at INTEGER NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ('failed', 'dead', 'lease_expired', 'superseded')),
    error TEXT,
    note TEXT,
    PRIMARY KEY (job_id, attempt)
) STRICT;

CREATE TABLE oncebox_intents (
    key TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    job_id INTEGER,
    claimed_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX oncebox_intents_task_claimed ON oncebox_intents (task, claimed_at);

CREATE TABLE oncebox_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target_kind TEXT NOT NULL,
    target_id INTEGER,
    target_key TEXT,
    reason TEXT NOT NULL,
    details TEXT
) STRICT;
CREATE INDEX oncebox_audit_target ON oncebox_audit (target_kind, target_id);
