-- The outbox: messages and their delivery attempts.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: outbox_notify
-- Wake idle dispatchers after messages became ready without an insert (replay, resend).
SELECT pg_notify('oncebox_outbox', %(schema)s);

-- name: outbox_insert
-- The handlers' buffered rows of one consumer transaction, as one set. A key already in the
-- outbox (its intent pruned by policy, then claimed again) is not re-sent.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_outbox
    (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at,
     trace_context)
SELECT r ->> 0, r ->> 1, r ->> 2, r -> 3, r ->> 4, (r ->> 5)::bigint, clock.now, clock.now,
       r ->> 6
FROM jsonb_array_elements(%(rows)s::jsonb) AS r, clock  -- [key, intent key, channel, payload,
ON CONFLICT (key) DO NOTHING;                             -- token, job id, trace context] per row

-- name: outbox_lease_settings
-- Run before outbox_lease, in its transaction: each channel's due rows are read in the due index's
-- order and the read stops at the limit, whatever the statistics say (see job_lease_settings; the
-- outbox grows from empty just as fast). Sorting stays allowed: the channels' heads are merged by
-- a sort of at most limit x channels rows. Unlike the job lease, this commit waits for its flush:
-- first_leased_at starts the provider's idempotency window and must be durable before a send.
SELECT set_config('enable_bitmapscan', 'off', true), set_config('jit', 'off', true);

-- name: outbox_lease
-- Lease due pending rows of the given channels; first_leased_at is set once, here. Each channel
-- is read on its own (the due index starts with the channel, so `channel = ANY(...)` would read
-- every due row and sort them: O(backlog) per lease); the earliest of the channels' heads win.
-- fence: state, next_attempt_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
picked AS (
    SELECT head.id
    FROM unnest(%(channels)s::text[]) AS c(channel)
    CROSS JOIN LATERAL (
        SELECT o.id, o.next_attempt_at FROM __S__.oncebox_outbox o
        WHERE o.state = 'pending'
          AND o.channel = c.channel
          AND o.next_attempt_at <= (SELECT now FROM clock)
        ORDER BY o.next_attempt_at, o.id
        LIMIT %(limit)s
        FOR UPDATE OF o SKIP LOCKED
    ) AS head
    ORDER BY head.next_attempt_at, head.id
    LIMIT %(limit)s
)
UPDATE __S__.oncebox_outbox o
SET state = 'leased',
    leased_by = %(worker)s,
    leased_at = clock.now,
    lease_token = %(token)s,
    lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
    first_leased_at = COALESCE(o.first_leased_at, clock.now)
FROM clock
WHERE o.id = ANY(ARRAY(SELECT id FROM picked))  -- by primary key (see job_lease)
RETURNING o.id, o.key, o.intent_key, o.channel, o.payload::text AS payload_json, o.token,
          o.attempt, o.attempt_base, o.possible_duplicates, o.first_leased_at,
          clock.now AS leased_at, o.uncertain, o.rescues, o.trace_context;

-- name: outbox_next_due
-- When the earliest pending row of these channels falls due (NULL if none), and the time now:
-- how long an idle dispatcher may wait (a retry's backoff, a rate limit's give-back, a pause).
-- Each channel's head is read from the due index, as the lease reads it: the first pending row
-- from this channel on in (channel, next_attempt_at) order, kept when it is this channel's. A
-- "channel = c.channel ORDER BY next_attempt_at" would let the planner, on stale statistics,
-- read every pending row of the channel through another index and sort them.
SELECT (SELECT min(head.next_attempt_at)
        FROM unnest(%(channels)s::text[]) AS c(channel)
        CROSS JOIN LATERAL (
            SELECT o.channel, o.next_attempt_at FROM __S__.oncebox_outbox o
            WHERE o.state = 'pending' AND o.channel >= c.channel
            ORDER BY o.channel, o.next_attempt_at
            LIMIT 1
        ) AS head
        WHERE head.channel = c.channel) AS at,
       (SELECT __S__.oncebox_now()) AS now;

-- name: outbox_mark_sending
-- The one durable write before a send through a channel without provider idempotency.
-- fence: state, lease_token
UPDATE __S__.oncebox_outbox SET state = 'sending'
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'leased'
RETURNING id;

-- name: outbox_finish
-- Settle rows of one lease, fenced on its token, and record the delivery attempts.
-- fence: lease_token
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
input AS MATERIALIZED (  -- %(finishes)s: [id, state, outcome, counts, delay in s, error,
                         -- receipt, dup, uncertain, rescued] per row
    SELECT (f ->> 0)::bigint AS id, f ->> 1 AS state, f ->> 2 AS outcome,
           (f ->> 3)::bool AS counts, (f ->> 4)::float8 AS delay_s, f ->> 5 AS error,
           f ->> 6 AS receipt, (f ->> 7)::bool AS dup, (f ->> 8)::bool AS uncertain,
           (f ->> 9)::bool AS rescued
    FROM jsonb_array_elements(%(finishes)s::jsonb) AS f
),
settled AS (
    UPDATE __S__.oncebox_outbox o
    SET state = i.state,
        attempt = o.attempt + CASE WHEN i.counts THEN 1 ELSE 0 END,
        possible_duplicates = o.possible_duplicates + CASE WHEN i.dup THEN 1 ELSE 0 END,
        rescues = o.rescues + CASE WHEN i.rescued THEN 1 ELSE 0 END,
        next_attempt_at = CASE WHEN i.state = 'pending'
                               THEN clock.now + make_interval(secs => i.delay_s)
                               ELSE o.next_attempt_at END,
        sent_at = CASE WHEN i.state = 'sent' THEN clock.now ELSE o.sent_at END,
        receipt = COALESCE(i.receipt, o.receipt),
        last_error = CASE WHEN i.state = 'sent' THEN o.last_error
                          ELSE COALESCE(i.error, o.last_error) END,
        uncertain = COALESCE(i.uncertain, o.uncertain),
        -- given back unsent, never sent before: the idempotency window has not started
        first_leased_at = CASE WHEN i.outcome IS NULL AND NOT i.counts AND o.attempt = 0
                                    AND NOT o.uncertain THEN NULL
                               ELSE o.first_leased_at END,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM input i, clock
    -- by primary key whatever the statistics, and the token implies a leased or sending row (a
    -- CHECK constraint): see job_finish
    WHERE o.id = ANY(ARRAY(SELECT id FROM input)) AND o.id = i.id AND o.lease_token = %(token)s
    RETURNING o.id, o.attempt, o.leased_by, o.leased_at, i.outcome, i.error, i.receipt, i.dup,
              i.rescued, o.state, clock.now
),
recorded AS (
    INSERT INTO __S__.oncebox_delivery_attempts
        (outbox_id, attempt, worker, started_at, finished_at, outcome, error, receipt)
    SELECT id, attempt, leased_by, leased_at, now, outcome, error, receipt
    FROM settled WHERE outcome IS NOT NULL
),
counted AS (  -- what each settled row became (oncebox/kernel/counters.py; counters.sql)
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT v.name, pg_backend_pid(), count(*)
    FROM settled s,
         (VALUES ('sends_ambiguous'), ('sends_dead'), ('sends_lease_expired'),
                 ('sends_possible_duplicate'), ('sends_resent'), ('sends_retried'),
                 ('sends_sent'), ('sends_throttled'), ('sends_waited')) AS v(name)
    WHERE CASE v.name
              WHEN 'sends_sent' THEN s.state = 'sent'
              WHEN 'sends_retried' THEN s.outcome = 'failed'
              WHEN 'sends_throttled' THEN s.outcome = 'throttled'
              WHEN 'sends_dead' THEN s.state = 'dead'
              WHEN 'sends_ambiguous' THEN s.state = 'ambiguous'
              WHEN 'sends_resent' THEN s.state = 'pending'
                                        AND s.outcome IN ('ambiguous', 'lease_expired')
              WHEN 'sends_possible_duplicate' THEN s.dup
              WHEN 'sends_lease_expired' THEN s.rescued
              WHEN 'sends_waited' THEN s.state = 'pending' AND s.outcome IS NULL
                                       AND NOT s.rescued
          END
    GROUP BY v.name
    ORDER BY v.name
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id FROM settled;

-- name: outbox_rescue_select
-- Rows whose lease expired, locked for the rescue's decision (the caller's transaction).
SELECT id, key, intent_key, channel, payload::text AS payload_json, token, job_id, state, attempt,
       attempt_base, possible_duplicates, next_attempt_at, created_at, first_leased_at,
       leased_by, lease_token::text, lease_expires_at, sent_at, receipt, last_error,
       uncertain, rescues
FROM __S__.oncebox_outbox
WHERE state IN ('leased', 'sending') AND lease_expires_at < (SELECT __S__.oncebox_now())
  AND channel = ANY(%(channels)s::text[])
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: outbox_resolve
-- Ambiguous → sent (the provider has it) or pending (resend now), audited in the same statement.
-- The resolver's (`seen_attempt` set) only on the hold it judged, read with its page — its
-- attempt count and the delivery attempt `a.id` that recorded the hold (every hold records one,
-- so a later hold has a later one) — and only while no provider event names the row (`events`,
-- counted on the row by each event's own transaction). A write that waited for another
-- transaction's lock re-reads the row's own columns, so an event committed meanwhile stops it;
-- the subquery is read as the statement began, which is enough: no one transaction takes a
-- held row to its next hold.
-- fence: state, seen_attempt, seen_held_by, events, reported
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
resolved AS (
    UPDATE __S__.oncebox_outbox o
    SET state = CASE WHEN %(resolution)s = 'sent' THEN 'sent' ELSE 'pending' END,
        sent_at = CASE WHEN %(resolution)s = 'sent' THEN clock.now ELSE o.sent_at END,
        receipt = COALESCE(%(receipt)s, o.receipt),
        next_attempt_at = clock.now,
        -- resend: the operator decided it was not delivered, so the next send is a first one
        -- (not "uncertain past the idempotency window", which would hold it ambiguous again)
        uncertain = CASE WHEN %(resolution)s = 'sent' THEN o.uncertain ELSE false END,
        first_leased_at = CASE WHEN %(resolution)s = 'sent' THEN o.first_leased_at END
    FROM clock
    WHERE o.id = %(id)s AND o.state = 'ambiguous'
      AND (%(seen_attempt)s::int IS NULL
           OR (o.attempt = %(seen_attempt)s::int
               AND (SELECT max(a.id) FROM __S__.oncebox_delivery_attempts a
                    WHERE a.outbox_id = o.id) IS NOT DISTINCT FROM %(seen_held_by)s::bigint
               AND o.events = 0 AND o.reported IS NULL))
    RETURNING o.id, o.key, o.channel, clock.now
),
audited AS (
    INSERT INTO __S__.oncebox_audit
        (at, actor, action, target_kind, target_id, target_key, reason, details)
    SELECT now, %(actor)s, 'resolve-' || %(resolution)s, 'delivery', id, key, %(reason)s,
           jsonb_build_object('channel', channel)
    FROM resolved
    RETURNING id
)
SELECT r.id AS job_id, r.key, a.id AS audit_id FROM resolved r, audited a;

-- name: outbox_replay
-- Dead → pending in place: same key, same frozen content; audited in the same statement. With
-- `if_attempt`, only while the row's attempt count is the one an operator confirmed (job_replay).
-- fence: state, if_attempt
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
replayed AS (
    UPDATE __S__.oncebox_outbox o
    SET state = 'pending', next_attempt_at = clock.now, attempt_base = o.attempt, rescues = 0
    FROM clock
    WHERE o.id = %(id)s AND o.state = 'dead' AND o.discarded_at IS NULL
      AND (%(if_attempt)s::int IS NULL OR o.attempt = %(if_attempt)s::int)
    RETURNING o.id, o.key, o.channel, o.attempt, clock.now
),
audited AS (
    INSERT INTO __S__.oncebox_audit
        (at, actor, action, target_kind, target_id, target_key, reason, details)
    SELECT now, %(actor)s, 'replay', 'delivery', id, key, %(reason)s,
           jsonb_build_object('channel', channel, 'attempts_before', attempt)
    FROM replayed
    RETURNING id
)
SELECT r.id AS job_id, r.key, a.id AS audit_id FROM replayed r, audited a;

-- name: outbox_discard__lock
-- Every message of the intent, locked: two sibling messages discarded at once must not each
-- see the other still standing and both leave the intent claimed.
SELECT o.id FROM __S__.oncebox_outbox o
WHERE o.intent_key = (SELECT intent_key FROM __S__.oncebox_outbox WHERE id = %(id)s)
ORDER BY o.id
FOR UPDATE;

-- name: outbox_discard
-- Dead → discarded (an operator: content no provider will take). The state stays 'dead' and
-- `discarded_at` says discarded (0007); the key is renamed `key~discarded-<id>` so a re-run of
-- its job can write the key afresh. Only a row that cannot have been delivered: never sent with
-- an unknown outcome, never resent blind. `if_attempt` as in outbox_replay.
-- fence: state, discarded_at, if_attempt
UPDATE __S__.oncebox_outbox
SET discarded_at = __S__.oncebox_now(), key = key || '~discarded-' || id
WHERE id = %(id)s AND state = 'dead' AND discarded_at IS NULL
  AND NOT uncertain AND possible_duplicates = 0
  AND (%(if_attempt)s::int IS NULL OR attempt = %(if_attempt)s::int)
RETURNING id, key, intent_key, job_id, channel;

-- name: outbox_discard__kept
-- The intent's other messages still standing: while one is, the intent stays claimed.
SELECT key, state FROM __S__.oncebox_outbox
WHERE intent_key = %(intent_key)s AND discarded_at IS NULL
ORDER BY id;

-- name: outbox_discard__release
-- fence: locked by outbox_discard__lock
DELETE FROM __S__.oncebox_intents WHERE key = %(intent_key)s RETURNING key;

-- name: outbox_discard__job
-- The job that wrote the discarded messages is dead again, so `dlq replay` re-runs it: back from
-- the history into the jobs table (0025), under its id and key.
-- fence: state, locked by outbox_discard__lock
WITH in_place AS (  -- a job done before the history, not yet moved into it
    UPDATE __S__.oncebox_jobs
    SET state = 'dead', outcome = NULL, finished_at = __S__.oncebox_now(), last_error = %(error)s
    WHERE id = %(job_id)s AND state = 'done'
    RETURNING id
),
reopened AS (
    DELETE FROM __S__.oncebox_job_history
    WHERE id = %(job_id)s AND state = 'done'
    RETURNING *
),
back AS (
    INSERT INTO __S__.oncebox_jobs
        (id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
         attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
         last_error, schedule, period, trace_context, limit_key)
    SELECT id, key, task, queue, args, 'dead', NULL, priority, group_key, attempt, max_attempts,
           attempt_base, run_at, expires_at, created_at, leased_by, leased_at, __S__.oncebox_now(),
           %(error)s, schedule, period, trace_context, limit_key
    FROM reopened
    RETURNING id
)
SELECT id FROM in_place UNION ALL SELECT id FROM back;

-- name: outbox_discard__audit
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (__S__.oncebox_now(), %(actor)s, 'discard', 'delivery', %(id)s, %(key)s, %(reason)s,
        jsonb_build_object('channel', %(channel)s::text, 'renamed', %(renamed)s::text,
                           'intent_released', %(released)s::boolean,
                           'job_reopened', %(job_reopened)s::bigint))
RETURNING id;

-- name: outbox_report_duplicate
-- A sent message a recipient says arrived twice: the row, unchanged (the report is the audit
-- entry and the counter, written with it).
SELECT id, key, channel FROM __S__.oncebox_outbox
WHERE id = %(id)s AND state = 'sent' AND discarded_at IS NULL;

-- name: outbox_report_duplicate__audit
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (__S__.oncebox_now(), %(actor)s, 'report-duplicate', 'delivery', %(id)s, %(key)s,
        %(reason)s, jsonb_build_object('channel', %(channel)s::text))
RETURNING id;

-- name: outbox_get
SELECT id, key, intent_key, channel, payload::text AS payload_json, token, job_id,
       CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END AS state, attempt,
       attempt_base, possible_duplicates, next_attempt_at, created_at, first_leased_at,
       leased_by, lease_token::text, lease_expires_at, sent_at, receipt, last_error,
       uncertain, rescues, payload_dropped_at, reported, reported_at
FROM __S__.oncebox_outbox WHERE id = %(id)s;

-- name: outbox_find_by_key
SELECT id, key, intent_key, channel, payload::text AS payload_json, token, job_id,
       CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END AS state, attempt,
       attempt_base, possible_duplicates, next_attempt_at, created_at, first_leased_at,
       leased_by, lease_token::text, lease_expires_at, sent_at, receipt, last_error,
       uncertain, rescues, payload_dropped_at, reported, reported_at
FROM __S__.oncebox_outbox
WHERE key = %(key)s OR intent_key = %(key)s
   -- a discarded row, by the key it had (outbox_discard renames it)
   OR (intent_key = split_part(%(key)s, '~', 1) AND discarded_at IS NOT NULL
       AND left(key, length(%(key)s) + 11) = %(key)s || '~discarded-')
ORDER BY id;

-- name: outbox_ambiguous_list
-- Held messages of `channels` after `after` by id (the resolver pages through them all), with
-- when each was held (its last delivery attempt's end) and by which attempt record, the stage
-- its provider reports reached and how many events named it.
SELECT o.id, o.key, o.intent_key, o.channel, o.payload::text AS payload_json, o.token, o.job_id,
       o.state, o.attempt, o.attempt_base, o.possible_duplicates, o.next_attempt_at,
       o.created_at, o.first_leased_at, o.leased_by, o.lease_token::text, o.lease_expires_at,
       o.sent_at, o.receipt, o.last_error, o.uncertain, o.rescues, o.payload_dropped_at,
       o.reported, o.reported_at, o.events,
       COALESCE(last.finished_at, o.created_at) AS last_attempt_at, last.id AS last_attempt_id
FROM __S__.oncebox_outbox o
LEFT JOIN LATERAL (
    SELECT max(a.finished_at) AS finished_at, max(a.id) AS id
    FROM __S__.oncebox_delivery_attempts a WHERE a.outbox_id = o.id
) last ON true
WHERE o.state = 'ambiguous' AND o.channel = ANY(%(channels)s::text[]) AND o.id > %(after)s
ORDER BY o.id LIMIT %(limit)s;

-- name: outbox_count_by_state
-- From the depths the triggers keep (0010); a discarded message counts as 'discarded'.
SELECT state, sum(value)::bigint AS count
FROM __S__.oncebox_depths WHERE kind = 'message'
GROUP BY 1 HAVING sum(value) <> 0;

-- name: delivery_attempt_list
SELECT outbox_id, attempt, worker, started_at, finished_at, outcome, error, receipt
FROM __S__.oncebox_delivery_attempts WHERE outbox_id = %(id)s ORDER BY id;

-- name: outbox_list
-- Newest first, paged by id; a state's rows through its partial index (dead ones through
-- oncebox_outbox_attention: the second state test is the first as the index's predicate reads).
-- `error`: a case-insensitive substring of the last error; `period`: written by a job of that
-- schedule period; `older_than_s` / `newer_than_s`: its last delivery attempt (a dead row's: the
-- one it died of) ended at least / less than that long ago, `last_attempt_at` (a sent row whose
-- attempts retention pruned: when it was sent); a row never attempted matches neither.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT o.id, o.key, o.intent_key, o.channel, o.payload::text AS payload_json, o.token, o.job_id,
       CASE WHEN o.discarded_at IS NULL THEN o.state ELSE 'discarded' END AS state, o.attempt,
       o.attempt_base, o.possible_duplicates, o.next_attempt_at, o.created_at,
       o.first_leased_at, o.leased_by, o.lease_token::text, o.lease_expires_at, o.sent_at,
       o.receipt, o.last_error, o.uncertain, o.rescues, o.payload_dropped_at,
       o.reported, o.reported_at,
       last.finished_at AS last_attempt_at
FROM __S__.oncebox_outbox o
LEFT JOIN LATERAL (  -- a sent row whose attempts retention pruned: when it was sent
    SELECT COALESCE((SELECT d.finished_at FROM __S__.oncebox_delivery_attempts d
                     WHERE d.outbox_id = o.id ORDER BY d.id DESC LIMIT 1),
                    o.sent_at) AS finished_at
) last ON true
WHERE (%(state)s::text IS NULL
       OR (CASE WHEN o.discarded_at IS NULL THEN o.state ELSE 'discarded' END) = %(state)s::text)
  AND (%(state)s::text IS NULL
       OR o.state = CASE %(state)s::text WHEN 'discarded' THEN 'dead' ELSE %(state)s::text END)
  AND (%(channel)s::text IS NULL OR o.channel = %(channel)s::text)
  AND (%(reported)s::text IS NULL OR o.reported = %(reported)s::text)
  AND (%(error)s::text IS NULL OR strpos(lower(o.last_error), lower(%(error)s::text)) > 0)
  AND (%(period)s::text IS NULL
       OR EXISTS (SELECT 1 FROM __S__.oncebox_all_jobs j
                  WHERE j.id = o.job_id AND j.period = %(period)s::text))
  AND (%(older_than_s)s::float8 IS NULL
       OR last.finished_at
          <= (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s::float8))
  AND (%(newer_than_s)s::float8 IS NULL
       OR last.finished_at
          > (SELECT now FROM clock) - make_interval(secs => %(newer_than_s)s::float8))
  AND (%(before_id)s::bigint IS NULL OR o.id < %(before_id)s::bigint)
  AND (%(key_prefix)s::text IS NULL  -- a key range, through oncebox_outbox_key_key
       OR (o.key >= %(key_prefix)s::text AND o.key < %(key_upper)s::text))
ORDER BY o.id DESC
LIMIT %(limit)s;

-- name: outbox_payload_drop
-- Retention's first step for one channel's sent messages: a batch of those sent before the
-- cutoff, oldest first (oncebox_outbox_payload_held, 0014), lose their payload (recipients,
-- subject, bodies), kept as {} and `payload_dropped_at`; the row keeps its key, receipt and
-- times. Only sent rows: a pending, dead or ambiguous message is still to be acted on.
-- fence: state, payload_dropped_at, sent_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT o.id FROM __S__.oncebox_outbox o
    WHERE o.state = 'sent' AND o.payload_dropped_at IS NULL AND o.channel = %(channel)s
      AND o.sent_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
    ORDER BY o.sent_at, o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE __S__.oncebox_outbox o  -- by key, whatever the statistics (see job_finish)
SET payload = '{}'::jsonb, payload_dropped_at = (SELECT now FROM clock)
WHERE o.id = ANY(ARRAY(SELECT id FROM doomed))
RETURNING o.id;

-- name: outbox_payload_prunable
-- What retention holds of one channel's payloads: when the oldest sent message whose payload is
-- still held was sent, and how many outbox_payload_drop would thin now (up to %(limit)s).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT (SELECT min(sent_at) FROM __S__.oncebox_outbox
        WHERE state = 'sent' AND payload_dropped_at IS NULL AND channel = %(channel)s) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_outbox o
            WHERE %(older_than_s)s::float8 IS NOT NULL
              AND o.state = 'sent' AND o.payload_dropped_at IS NULL AND o.channel = %(channel)s
              AND o.sent_at < (SELECT now FROM clock)
                              - make_interval(secs => %(older_than_s)s::float8)
            LIMIT %(limit)s) w) AS waiting;

-- name: outbox_prune
-- Delete a batch of one channel's sent messages sent before the cutoff, oldest first
-- (oncebox_outbox_sent, 0014), with their delivery attempts — once the job that wrote each is
-- gone, so that job_prune has counted it in its period's summary, and no other message of its
-- intent waits (a sweeper's or a transport's messages have no job). A message's key then no longer
-- holds off a second message with the same key: its intent (kept for ever unless the task says
-- otherwise) still holds off the job that would write it.
-- fence: state, sent_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT o.id FROM __S__.oncebox_outbox o
    WHERE o.state = 'sent' AND o.channel = %(channel)s
      AND o.sent_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_all_jobs j WHERE j.id = o.job_id OFFSET 0)
      -- nor while a message of the same intent still waits (pending, dead, ambiguous): a
      -- discard of that one frees the intent only once no other message of it stands
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox s
                      WHERE s.intent_key = o.intent_key AND s.state <> 'sent'
                        AND s.discarded_at IS NULL OFFSET 0)
    ORDER BY o.sent_at, o.id
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
),
attempts AS (  -- by key, whatever the statistics (see job_finish)
    DELETE FROM __S__.oncebox_delivery_attempts a
    WHERE a.outbox_id = ANY(ARRAY(SELECT id FROM doomed))
)
DELETE FROM __S__.oncebox_outbox o WHERE o.id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING o.id;

-- name: outbox_prunable
-- What retention holds of one channel's sent messages: when the oldest was sent, and how many
-- outbox_prune would delete now (up to %(limit)s).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT (SELECT min(sent_at) FROM __S__.oncebox_outbox
        WHERE state = 'sent' AND channel = %(channel)s) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_outbox o
            WHERE %(older_than_s)s::float8 IS NOT NULL
              AND o.state = 'sent' AND o.channel = %(channel)s
              AND o.sent_at < (SELECT now FROM clock)
                              - make_interval(secs => %(older_than_s)s::float8)
              AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_all_jobs j WHERE j.id = o.job_id OFFSET 0)
              AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox s
                              WHERE s.intent_key = o.intent_key AND s.state <> 'sent'
                                AND s.discarded_at IS NULL OFFSET 0)
            LIMIT %(limit)s) w) AS waiting;

-- name: delivery_attempt_prune
-- Delete a batch of delivery attempts that ended before the cutoff, oldest first
-- (oncebox_delivery_attempts_finished, 0014), of messages that are sent: a pending, dead or
-- ambiguous message keeps its whole history for whoever acts on it. The row keeps its receipt.
-- fence: state, finished_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT a.id FROM __S__.oncebox_delivery_attempts a
    JOIN __S__.oncebox_outbox o ON o.id = a.outbox_id
    WHERE a.finished_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
      AND o.state = 'sent'
    ORDER BY a.finished_at, a.id
    LIMIT %(limit)s
    FOR UPDATE OF a SKIP LOCKED  -- pruners in several workers take different batches
)
DELETE FROM __S__.oncebox_delivery_attempts a
WHERE a.id = ANY(ARRAY(SELECT id FROM doomed))  -- by key, whatever the statistics
RETURNING a.id;

-- name: delivery_attempt_prunable
-- What retention holds of delivery attempts: when the oldest attempt of a sent message ended,
-- and how many delivery_attempt_prune would delete now (up to %(limit)s).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT (SELECT a.finished_at FROM __S__.oncebox_delivery_attempts a
        JOIN __S__.oncebox_outbox o ON o.id = a.outbox_id
        WHERE o.state = 'sent' ORDER BY a.finished_at, a.id LIMIT 1) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_delivery_attempts a
            JOIN __S__.oncebox_outbox o ON o.id = a.outbox_id
            WHERE %(older_than_s)s::float8 IS NOT NULL
              AND a.finished_at < (SELECT now FROM clock)
                                  - make_interval(secs => %(older_than_s)s::float8)
              AND o.state = 'sent'
            LIMIT %(limit)s) w) AS waiting;
