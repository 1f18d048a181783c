-- Retention (retention/policy.py): the pruner walks each kind of row it may delete or thin in
-- the order of the index below, one task, channel or schedule at a time, so a batch reads only
-- rows it will act on and a pass with nothing to do costs one index probe per name.
-- * a sent message's payload (its recipients and bodies) is dropped long before the row, which
--   keeps its key, receipt and times: `payload_dropped_at` says when (nullable, no default: added
--   without rewriting the table; the previous release never names it);
-- * finished jobs, by task and finish time (the depths give the tasks that have any);
-- * sent messages, by channel and send time: one index for those whose payload is still held,
--   one for every sent row (deleted once its job is gone and the channel's retention passed);
-- * delivery attempts and audit entries, by when they happened.
-- Building them blocks writes to each table, until the migration's transaction ends: run it
-- before the workers of this release start, at a quiet hour on a large database (deploy.md).
ALTER TABLE __S__.oncebox_outbox ADD COLUMN payload_dropped_at timestamptz;
CREATE INDEX oncebox_jobs_finished ON __S__.oncebox_jobs (task, finished_at, id)
    WHERE state IN ('done', 'cancelled');
CREATE INDEX oncebox_outbox_sent ON __S__.oncebox_outbox (channel, sent_at, id)
    WHERE state = 'sent';
CREATE INDEX oncebox_outbox_payload_held ON __S__.oncebox_outbox (channel, sent_at, id)
    WHERE state = 'sent' AND payload_dropped_at IS NULL;
CREATE INDEX oncebox_delivery_attempts_finished ON __S__.oncebox_delivery_attempts (finished_at, id);
CREATE INDEX oncebox_audit_at ON __S__.oncebox_audit (at, id);
