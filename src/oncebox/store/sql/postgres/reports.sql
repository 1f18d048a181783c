-- What providers report about the messages they took: delivery events and what they settle
-- (deliveries/, migration 0018). PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: provider_event_insert
-- One verified event, matched to its outbox row by token on its channel (a discarded row's
-- replacement carries the same token: the newest row not discarded is taken). No row back: the
-- event was recorded before (a provider's retry, a duplicate).
INSERT INTO __S__.oncebox_provider_events
    (channel, event_id, kind, token, provider_id, outbox_id, occurred_at, received_at)
SELECT %(channel)s, %(event_id)s, %(kind)s, %(token)s::text, %(provider_id)s::text,
       (SELECT o.id FROM __S__.oncebox_outbox o
        WHERE o.token = %(token)s::text AND o.channel = %(channel)s
        ORDER BY (o.discarded_at IS NULL) DESC, o.id DESC
        LIMIT 1),
       %(occurred_at)s::timestamptz, __S__.oncebox_now()
ON CONFLICT (channel, event_id) DO NOTHING
RETURNING id, outbox_id;

-- name: outbox_report_lock
-- The stage an outbox row's events reached so far, locked for the event's transaction (two
-- events of one message recorded at once: one waits, then reads the other's stage).
SELECT id, channel, state, reported FROM __S__.oncebox_outbox WHERE id = %(id)s FOR UPDATE;

-- name: outbox_report
-- One more event names the row: counted on it (`events`), and the furthest stage moved on when
-- the event advanced it (`stage`; NULL: it did not). Every event's transaction writes the row
-- (a sent row's only when the stage moves: no one judges it again), so a resolver's write
-- waiting for it re-reads the count once it commits and stops (outbox_resolve): a count of the
-- events table would be read as that write began.
-- fence: locked by outbox_report_lock
UPDATE __S__.oncebox_outbox
SET events = events + 1,
    reported = COALESCE(%(stage)s::text, reported),
    reported_at = CASE WHEN %(stage)s::text IS NULL THEN reported_at
                       ELSE __S__.oncebox_now() END
WHERE id = %(id)s
RETURNING id;

-- name: outbox_reported_list
-- Held (ambiguous) messages of `channels` a provider event says it took, with the first such
-- event (its id is the provider's receipt), after `after` by id — unless their furthest stage
-- keeps them held (`holding`: the provider had it and reported it failed).
SELECT o.id, o.channel, e.kind, e.provider_id, e.event_id
FROM __S__.oncebox_outbox o
JOIN LATERAL (
    SELECT x.kind, x.provider_id, x.event_id
    FROM __S__.oncebox_provider_events x
    WHERE x.outbox_id = o.id AND x.kind = ANY(%(accepted)s::text[])
    ORDER BY x.id
    LIMIT 1
) e ON true
WHERE o.state = 'ambiguous' AND o.channel = ANY(%(channels)s::text[])
  AND o.id > %(after)s
  AND (o.reported IS NULL OR NOT o.reported = ANY(%(holding)s::text[]))
ORDER BY o.id
LIMIT %(limit)s;

-- name: provider_event_list
SELECT id, channel, event_id, kind, token, provider_id, outbox_id, occurred_at, received_at
FROM __S__.oncebox_provider_events
WHERE outbox_id = %(id)s
ORDER BY id;

-- name: provider_event_prune
-- A batch of events received before the cutoff (their dedupe long past any provider's
-- retries), oldest first (oncebox_provider_events_received); retention (store/pruning.py). The
-- events of a message still held or dead are its evidence: kept while it is.
-- fence: received_at, state
DELETE FROM __S__.oncebox_provider_events
WHERE id = ANY(ARRAY(
    SELECT e.id FROM __S__.oncebox_provider_events e
    WHERE e.received_at < __S__.oncebox_now() - make_interval(secs => %(older_than_s)s)
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox o
                      WHERE o.id = e.outbox_id AND o.state IN ('ambiguous', 'dead'))
    ORDER BY e.received_at, e.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED))
RETURNING id;

-- name: provider_event_prunable
-- What retention holds of provider events: the oldest received, and how many
-- provider_event_prune would delete now (up to %(limit)s).
SELECT (SELECT received_at FROM __S__.oncebox_provider_events
        ORDER BY received_at, id LIMIT 1) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_provider_events e
            WHERE %(older_than_s)s::float8 IS NOT NULL
              AND e.received_at < __S__.oncebox_now()
                                  - make_interval(secs => %(older_than_s)s::float8)
              AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox o
                              WHERE o.id = e.outbox_id AND o.state IN ('ambiguous', 'dead'))
            LIMIT %(limit)s) w) AS waiting;
