-- When a fan-out's owner last renewed its run; see PostgreSQL's migration of the same name.
ALTER TABLE oncebox_schedule_runs ADD COLUMN renewed_at INTEGER;
