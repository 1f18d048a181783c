-- Each job and outbox row keeps the trace context it was written in; see PostgreSQL's 0013.
ALTER TABLE oncebox_jobs ADD COLUMN trace_context TEXT;
ALTER TABLE oncebox_outbox ADD COLUMN trace_context TEXT;
