-- Retention: a sent message's payload dropped before its row, and the indexes the pruner walks;
-- see PostgreSQL's 0014.
ALTER TABLE oncebox_outbox ADD COLUMN payload_dropped_at INTEGER;
CREATE INDEX oncebox_jobs_finished ON oncebox_jobs (task, finished_at, id)
    WHERE state IN ('done', 'cancelled');
CREATE INDEX oncebox_outbox_sent ON oncebox_outbox (channel, sent_at, id)
    WHERE state = 'sent';
CREATE INDEX oncebox_outbox_payload_held ON oncebox_outbox (channel, sent_at, id)
    WHERE state = 'sent' AND payload_dropped_at IS NULL;
CREATE INDEX oncebox_delivery_attempts_finished ON oncebox_delivery_attempts (finished_at, id);
CREATE INDEX oncebox_audit_at ON oncebox_audit (at, id);
