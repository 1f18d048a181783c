-- The outbox: messages and their delivery attempts.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: outbox_insert
-- :rows is a JSON array of [key, intent_key, channel, payload_json_text, token, job_id,
-- trace_context].
-- A key already in the outbox (its intent pruned by policy, then claimed again) is not re-sent.
INSERT INTO oncebox_outbox
    (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at,
     trace_context)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, r.value ->> 4, r.value ->> 5,
       :now, :now, r.value ->> 6
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (key) DO NOTHING;

-- name: outbox_lease
-- fence: state, next_attempt_at
UPDATE oncebox_outbox
SET state = 'leased',
    leased_by = :worker,
    leased_at = :now,
    lease_token = :token,
    lease_expires_at = :now + :lease_us,
    first_leased_at = COALESCE(first_leased_at, :now)
WHERE id IN (
    -- each channel's head read on its own, in the due index's order (`channel IN (...)` would
    -- read every due row and sort them: O(backlog) per lease); the earliest heads win
    SELECT o.id FROM json_each(:channels) AS c
    JOIN oncebox_outbox AS o ON o.id IN (
        SELECT h.id FROM oncebox_outbox AS h
        WHERE h.state = 'pending' AND h.channel = c.value AND h.next_attempt_at <= :now
        ORDER BY h.next_attempt_at, h.id
        LIMIT :limit)
    ORDER BY o.next_attempt_at, o.id
    LIMIT :limit)
RETURNING id, key, intent_key, channel, payload AS payload_json, token, attempt, attempt_base,
          possible_duplicates, first_leased_at, leased_at, uncertain, rescues, trace_context;

-- name: outbox_next_due
SELECT (SELECT min((SELECT o.next_attempt_at FROM oncebox_outbox AS o
                    WHERE o.state = 'pending' AND o.channel = c.value
                    ORDER BY o.next_attempt_at
                    LIMIT 1))
        FROM json_each(:channels) AS c) AS at,
       :now AS now;

-- name: outbox_mark_sending
-- fence: state, lease_token
UPDATE oncebox_outbox SET state = 'sending'
WHERE id = :id AND lease_token = :token AND state = 'leased'
RETURNING id;

-- name: outbox_finish
-- :rows is a JSON array of
-- [id, state, outcome, counts_attempt, delay_us, error, receipt, dup, uncertain (or null),
-- rescued].
-- fence: lease_token
UPDATE oncebox_outbox AS o
SET state = i.value ->> 1,
    attempt = o.attempt + (i.value ->> 3),
    possible_duplicates = o.possible_duplicates + (i.value ->> 7),
    rescues = o.rescues + (i.value ->> 9),
    next_attempt_at = CASE WHEN i.value ->> 1 = 'pending' THEN :now + (i.value ->> 4)
                           ELSE o.next_attempt_at END,
    sent_at = CASE WHEN i.value ->> 1 = 'sent' THEN :now ELSE o.sent_at END,
    receipt = COALESCE(i.value ->> 6, o.receipt),
    last_error = CASE WHEN i.value ->> 1 = 'sent' THEN o.last_error
                      ELSE COALESCE(i.value ->> 5, o.last_error) END,
    uncertain = COALESCE(i.value ->> 8, o.uncertain),
    first_leased_at = CASE WHEN i.value ->> 2 IS NULL AND i.value ->> 3 = 0 AND o.attempt = 0
                                AND o.uncertain = 0 THEN NULL
                           ELSE o.first_leased_at END,
    lease_token = NULL,
    lease_expires_at = NULL
FROM json_each(:rows) AS i
WHERE o.id = i.value ->> 0 AND o.lease_token = :token AND o.state IN ('leased', 'sending')
RETURNING id, attempt, leased_by, leased_at;

-- name: outbox_finish__record
-- :rows is a JSON array of [outbox_id, attempt, worker, started_at, outcome, error, receipt].
INSERT INTO oncebox_delivery_attempts
    (outbox_id, attempt, worker, started_at, finished_at, outcome, error, receipt)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, :now, r.value ->> 4,
       r.value ->> 5, r.value ->> 6
FROM json_each(:rows) AS r;

-- name: outbox_rescue_select
SELECT id, key, intent_key, channel, payload AS payload_json, token, job_id, state, attempt,
       attempt_base, possible_duplicates, next_attempt_at, created_at, first_leased_at,
       leased_by, lease_token, lease_expires_at, sent_at, receipt, last_error,
       uncertain, rescues
FROM oncebox_outbox
WHERE state IN ('leased', 'sending') AND lease_expires_at < :now
  AND channel IN (SELECT value FROM json_each(:channels))
ORDER BY lease_expires_at
LIMIT :limit;

-- name: outbox_resolve
-- See the PostgreSQL statement.
-- fence: state, seen_attempt, seen_held_by, events, reported
UPDATE oncebox_outbox
SET state = CASE WHEN :resolution = 'sent' THEN 'sent' ELSE 'pending' END,
    sent_at = CASE WHEN :resolution = 'sent' THEN :now ELSE sent_at END,
    receipt = COALESCE(:receipt, receipt),
    next_attempt_at = :now,
    -- resend: the operator decided it was not delivered, so the next send is a first one
    uncertain = CASE WHEN :resolution = 'sent' THEN uncertain ELSE 0 END,
    first_leased_at = CASE WHEN :resolution = 'sent' THEN first_leased_at ELSE NULL END
WHERE id = :id AND state = 'ambiguous'
  AND (:seen_attempt IS NULL
       OR (attempt = :seen_attempt
           AND (SELECT max(a.id) FROM oncebox_delivery_attempts a
                WHERE a.outbox_id = oncebox_outbox.id) IS :seen_held_by
           AND events = 0 AND reported IS NULL))
RETURNING id, key, channel;

-- name: outbox_resolve__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'resolve-' || :resolution, 'delivery', :id, :key, :reason,
        json_object('channel', :channel))
RETURNING id;

-- name: outbox_replay
-- See the PostgreSQL statement (`if_attempt`: the row as an operator confirmed it).
-- fence: state, if_attempt
UPDATE oncebox_outbox
SET state = 'pending', next_attempt_at = :now, attempt_base = attempt, rescues = 0
WHERE id = :id AND state = 'dead' AND discarded_at IS NULL
  AND (:if_attempt IS NULL OR attempt = :if_attempt)
RETURNING id, key, channel, attempt;

-- name: outbox_replay__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'replay', 'delivery', :id, :key, :reason,
        json_object('channel', :channel, 'attempts_before', :attempt))
RETURNING id;

-- name: outbox_discard__lock
-- The discard's transaction already holds SQLite's write lock: nothing to lock row by row.
SELECT id FROM oncebox_outbox WHERE id = :id;

-- name: outbox_discard
-- Dead → discarded (an operator: content no provider will take). The state stays 'dead' and
-- `discarded_at` says discarded (0007); the key is renamed `key~discarded-<id>` so a re-run of
-- its job can write the key afresh. Only a row that cannot have been delivered: never sent with
-- an unknown outcome, never resent blind. `if_attempt` as in outbox_replay.
-- fence: state, discarded_at, if_attempt
UPDATE oncebox_outbox
SET discarded_at = :now, key = key || '~discarded-' || id
WHERE id = :id AND state = 'dead' AND discarded_at IS NULL
  AND NOT uncertain AND possible_duplicates = 0
  AND (:if_attempt IS NULL OR attempt = :if_attempt)
RETURNING id, key, intent_key, job_id, channel;

-- name: outbox_discard__kept
-- The intent's other messages still standing: while one is, the intent stays claimed.
SELECT key, state FROM oncebox_outbox
WHERE intent_key = :intent_key AND discarded_at IS NULL
ORDER BY id;

-- name: outbox_discard__release
-- fence: locked by outbox_discard__lock
DELETE FROM oncebox_intents WHERE key = :intent_key RETURNING key;

-- name: outbox_discard__job
-- The job that wrote the discarded messages is dead again, so `dlq replay` re-runs it.
-- fence: state, locked by outbox_discard__lock
UPDATE oncebox_jobs
SET state = 'dead', outcome = NULL, finished_at = :now, last_error = :error
WHERE id = :job_id AND state = 'done'
RETURNING id;

-- name: outbox_discard__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'discard', 'delivery', :id, :key, :reason,
        json_object('channel', :channel, 'renamed', :renamed, 'intent_released', json(CASE WHEN :released THEN 'true' ELSE 'false' END),
                    'job_reopened', :job_reopened))
RETURNING id;

-- name: outbox_report_duplicate
-- A sent message a recipient says arrived twice: the row, unchanged (the report is the audit
-- entry and the counter, written with it).
SELECT id, key, channel FROM oncebox_outbox
WHERE id = :id AND state = 'sent' AND discarded_at IS NULL;

-- name: outbox_report_duplicate__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'report-duplicate', 'delivery', :id, :key, :reason,
        json_object('channel', :channel))
RETURNING id;

-- name: outbox_get
SELECT id, key, intent_key, channel, payload AS payload_json, token, job_id,
       CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END AS state, attempt,
       attempt_base, possible_duplicates, next_attempt_at, created_at, first_leased_at,
       leased_by, lease_token, lease_expires_at, sent_at, receipt, last_error,
       uncertain, rescues, payload_dropped_at, reported, reported_at
FROM oncebox_outbox WHERE id = :id;

-- name: outbox_find_by_key
SELECT id, key, intent_key, channel, payload AS payload_json, token, job_id,
       CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END AS state, attempt,
       attempt_base, possible_duplicates, next_attempt_at, created_at, first_leased_at,
       leased_by, lease_token, lease_expires_at, sent_at, receipt, last_error,
       uncertain, rescues, payload_dropped_at, reported, reported_at
FROM oncebox_outbox
WHERE key = :key OR intent_key = :key
   -- a discarded row, by the key it had (outbox_discard renames it)
   OR (intent_key = substr(:key, 1, instr(:key || '~', '~') - 1) AND discarded_at IS NOT NULL
       AND substr(key, 1, length(:key) + 11) = :key || '~discarded-')
ORDER BY id;

-- name: outbox_ambiguous_list
-- See the PostgreSQL statement.
SELECT o.id, o.key, o.intent_key, o.channel, o.payload AS payload_json, o.token, o.job_id,
       o.state, o.attempt, o.attempt_base, o.possible_duplicates, o.next_attempt_at,
       o.created_at, o.first_leased_at, o.leased_by, o.lease_token, o.lease_expires_at,
       o.sent_at, o.receipt, o.last_error, o.uncertain, o.rescues, o.payload_dropped_at,
       o.reported, o.reported_at, o.events,
       COALESCE((SELECT max(a.finished_at) FROM oncebox_delivery_attempts a
                 WHERE a.outbox_id = o.id), o.created_at) AS last_attempt_at,
       (SELECT max(a.id) FROM oncebox_delivery_attempts a
        WHERE a.outbox_id = o.id) AS last_attempt_id
FROM oncebox_outbox o
WHERE o.state = 'ambiguous' AND o.channel IN (SELECT value FROM json_each(:channels))
  AND o.id > :after
ORDER BY o.id LIMIT :limit;

-- name: outbox_count_by_state
-- From the depths the triggers keep (0010); a discarded message counts as 'discarded'.
SELECT state, sum(value) AS count
FROM oncebox_depths WHERE kind = 'message'
GROUP BY 1 HAVING sum(value) <> 0;

-- name: delivery_attempt_list
SELECT outbox_id, attempt, worker, started_at, finished_at, outcome, error, receipt
FROM oncebox_delivery_attempts WHERE outbox_id = :id ORDER BY id;

-- name: outbox_list
-- See the PostgreSQL statement; the last attempt's end is a correlated subquery (SQLite has no
-- LATERAL), and lower() folds ASCII letters only.
SELECT * FROM (
    SELECT o.id, o.key, o.intent_key, o.channel, o.payload AS payload_json, o.token, o.job_id,
           CASE WHEN o.discarded_at IS NULL THEN o.state ELSE 'discarded' END AS state,
           o.attempt, o.attempt_base, o.possible_duplicates, o.next_attempt_at, o.created_at,
           o.first_leased_at, o.leased_by, o.lease_token, o.lease_expires_at, o.sent_at,
           o.receipt, o.last_error, o.uncertain, o.rescues, o.payload_dropped_at,
       o.reported, o.reported_at,
           COALESCE((SELECT d.finished_at FROM oncebox_delivery_attempts d
                     WHERE d.outbox_id = o.id ORDER BY d.id DESC LIMIT 1),
                    o.sent_at) AS last_attempt_at
    FROM oncebox_outbox o
    WHERE (:state IS NULL
           OR (CASE WHEN o.discarded_at IS NULL THEN o.state ELSE 'discarded' END) = :state)
      AND (:channel IS NULL OR o.channel = :channel)
      AND (:reported IS NULL OR o.reported = :reported)
      AND (:error IS NULL OR instr(lower(o.last_error), lower(:error)) > 0)
      AND (:period IS NULL
           OR EXISTS (SELECT 1 FROM oncebox_jobs j WHERE j.id = o.job_id AND j.period = :period))
      AND (:key_prefix IS NULL OR (o.key >= :key_prefix AND o.key < :key_upper))
      AND (:before_id IS NULL OR o.id < :before_id)
)
WHERE (:older_than_us IS NULL OR last_attempt_at <= :now - :older_than_us)
  AND (:newer_than_us IS NULL OR last_attempt_at > :now - :newer_than_us)
ORDER BY id DESC
LIMIT :limit;

-- name: outbox_payload_drop
-- See the PostgreSQL statement.
-- fence: state, payload_dropped_at, sent_at
UPDATE oncebox_outbox
SET payload = '{}', payload_dropped_at = :now
WHERE id IN (
    SELECT id FROM oncebox_outbox
    WHERE state = 'sent' AND payload_dropped_at IS NULL AND channel = :channel
      AND sent_at < :now - :older_than_us
    ORDER BY sent_at, id
    LIMIT :limit)
RETURNING id;

-- name: outbox_payload_prunable
-- See the PostgreSQL query.
SELECT (SELECT min(sent_at) FROM oncebox_outbox
        WHERE state = 'sent' AND payload_dropped_at IS NULL AND channel = :channel) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_outbox
            WHERE :older_than_us IS NOT NULL
              AND state = 'sent' AND payload_dropped_at IS NULL AND channel = :channel
              AND sent_at < :now - :older_than_us
            LIMIT :limit)) AS waiting;

-- name: outbox_prune
-- See the PostgreSQL statement; the attempts go in outbox_prune__attempts, first.
-- fence: locked by outbox_prune__select
DELETE FROM oncebox_outbox
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id;

-- name: outbox_prune__select
-- The batch outbox_prune deletes (see the PostgreSQL statement).
SELECT o.id FROM oncebox_outbox o
WHERE o.state = 'sent' AND o.channel = :channel
  AND o.sent_at < :now - :older_than_us
  AND NOT EXISTS (SELECT 1 FROM oncebox_jobs j WHERE j.id = o.job_id)
  AND NOT EXISTS (SELECT 1 FROM oncebox_outbox s
                  WHERE s.intent_key = o.intent_key AND s.state <> 'sent'
                    AND s.discarded_at IS NULL)
ORDER BY o.sent_at, o.id
LIMIT :limit;

-- name: outbox_prune__attempts
-- no fence: the attempts of the messages outbox_prune deletes in this transaction
DELETE FROM oncebox_delivery_attempts WHERE outbox_id IN (SELECT value FROM json_each(:ids));

-- name: outbox_prunable
-- See the PostgreSQL query.
SELECT (SELECT min(sent_at) FROM oncebox_outbox
        WHERE state = 'sent' AND channel = :channel) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_outbox o
            WHERE :older_than_us IS NOT NULL
              AND o.state = 'sent' AND o.channel = :channel
              AND o.sent_at < :now - :older_than_us
              AND NOT EXISTS (SELECT 1 FROM oncebox_jobs j WHERE j.id = o.job_id)
              AND NOT EXISTS (SELECT 1 FROM oncebox_outbox s
                              WHERE s.intent_key = o.intent_key AND s.state <> 'sent'
                                AND s.discarded_at IS NULL)
            LIMIT :limit)) AS waiting;

-- name: delivery_attempt_prune
-- See the PostgreSQL statement.
-- fence: state, finished_at
DELETE FROM oncebox_delivery_attempts
WHERE id IN (
    SELECT a.id FROM oncebox_delivery_attempts a
    JOIN oncebox_outbox o ON o.id = a.outbox_id
    WHERE a.finished_at < :now - :older_than_us AND o.state = 'sent'
    ORDER BY a.finished_at, a.id
    LIMIT :limit)
RETURNING id;

-- name: delivery_attempt_prunable
-- See the PostgreSQL query.
SELECT (SELECT a.finished_at FROM oncebox_delivery_attempts a
        JOIN oncebox_outbox o ON o.id = a.outbox_id
        WHERE o.state = 'sent' ORDER BY a.finished_at, a.id LIMIT 1) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_delivery_attempts a
            JOIN oncebox_outbox o ON o.id = a.outbox_id
            WHERE :older_than_us IS NOT NULL
              AND a.finished_at < :now - :older_than_us AND o.state = 'sent'
            LIMIT :limit)) AS waiting;
