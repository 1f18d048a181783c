-- What each task's limits were last declared as, and when; see PostgreSQL's migration of the
-- same name.
CREATE TABLE oncebox_limit_declarations (
    task TEXT PRIMARY KEY,
    limits TEXT NOT NULL,
    declared_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
