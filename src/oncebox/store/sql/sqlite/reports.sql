-- What providers report about the messages they took (deliveries/, migration 0017).
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: provider_event_insert
-- See the PostgreSQL statement.
INSERT INTO oncebox_provider_events
    (channel, event_id, kind, token, provider_id, outbox_id, occurred_at, received_at)
SELECT :channel, :event_id, :kind, :token, :provider_id,
       (SELECT o.id FROM oncebox_outbox o
        WHERE o.token = :token AND o.channel = :channel
        ORDER BY (o.discarded_at IS NULL) DESC, o.id DESC
        LIMIT 1),
       :occurred_at, :now
WHERE true
ON CONFLICT (channel, event_id) DO NOTHING
RETURNING id, outbox_id;

-- name: outbox_report_lock
-- The event's transaction already holds SQLite's write lock.
SELECT id, channel, state, reported FROM oncebox_outbox WHERE id = :id;

-- name: outbox_report
-- See the PostgreSQL statement.
-- fence: locked by outbox_report_lock
UPDATE oncebox_outbox
SET events = events + 1,
    reported = COALESCE(:stage, reported),
    reported_at = CASE WHEN :stage IS NULL THEN reported_at ELSE :now END
WHERE id = :id
RETURNING id;

-- name: outbox_reported_list
-- See the PostgreSQL statement.
SELECT o.id, o.channel, e.kind, e.provider_id, e.event_id
FROM oncebox_outbox o
JOIN oncebox_provider_events e
  ON e.id = (SELECT min(x.id) FROM oncebox_provider_events x
             WHERE x.outbox_id = o.id
               AND x.kind IN (SELECT value FROM json_each(:accepted)))
WHERE o.state = 'ambiguous' AND o.channel IN (SELECT value FROM json_each(:channels))
  AND o.id > :after
  AND (o.reported IS NULL OR o.reported NOT IN (SELECT value FROM json_each(:holding)))
ORDER BY o.id
LIMIT :limit;

-- name: provider_event_list
SELECT id, channel, event_id, kind, token, provider_id, outbox_id, occurred_at, received_at
FROM oncebox_provider_events
WHERE outbox_id = :id
ORDER BY id;

-- name: provider_event_prune
-- See the PostgreSQL statement.
-- fence: received_at, state
DELETE FROM oncebox_provider_events
WHERE id IN (SELECT e.id FROM oncebox_provider_events e
             WHERE e.received_at < :now - :older_than_us
               AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o
                               WHERE o.id = e.outbox_id AND o.state IN ('ambiguous', 'dead'))
             ORDER BY e.received_at, e.id
             LIMIT :limit)
RETURNING id;

-- name: provider_event_prunable
-- See the PostgreSQL query.
SELECT (SELECT received_at FROM oncebox_provider_events
        ORDER BY received_at, id LIMIT 1) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_provider_events e
            WHERE :older_than_us IS NOT NULL AND e.received_at < :now - :older_than_us
              AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o
                              WHERE o.id = e.outbox_id AND o.state IN ('ambiguous', 'dead'))
            LIMIT :limit)) AS waiting;
