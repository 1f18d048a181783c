-- How many provider events have named each outbox row; see PostgreSQL's outbox_events.
ALTER TABLE oncebox_outbox ADD COLUMN events INTEGER NOT NULL DEFAULT 0;
UPDATE oncebox_outbox
SET events = (SELECT count(*) FROM oncebox_provider_events e
              WHERE e.outbox_id = oncebox_outbox.id)
WHERE state IN ('ambiguous', 'dead')
  AND EXISTS (SELECT 1 FROM oncebox_provider_events e WHERE e.outbox_id = oncebox_outbox.id);
