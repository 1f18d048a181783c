-- oncebox queries for SQLite. Same names as the PostgreSQL file. Differences by design:
-- * time: the store evaluates oncebox_now() once per operation, in process (it is the same
--   Python function SQL calls), and binds it as :now, so every statement of an operation sees
--   one instant; instants and durations are integer microseconds;
-- * sets: lists arrive as one JSON array parameter, read with json_each;
-- * SQLite has no data-modifying CTEs, so an operation PostgreSQL does in one statement may be
--   several here, named `operation__step` and run by the store in the same transaction.

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS oncebox_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    checksum TEXT NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT;

-- name: migration_list
SELECT version, name, checksum FROM oncebox_migrations ORDER BY version;

-- name: migration_record
INSERT INTO oncebox_migrations (version, name, checksum, applied_at)
VALUES (:version, :name, :checksum, :now);

-- name: clock_now
SELECT oncebox_now();

-- name: job_insert
INSERT INTO oncebox_jobs
    (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at, created_at)
SELECT :key, :task, :queue, :args, :priority, :group_key, :max_attempts,
       COALESCE(:run_at, :now + :delay_us), :now + :max_age_us, :now
WHERE :key IS NULL OR NOT EXISTS (SELECT 1 FROM oncebox_intents i WHERE i.key = :key)
ON CONFLICT (key) WHERE state <> 'cancelled' DO NOTHING
RETURNING id, state;

-- name: job_insert_many
-- :rows is a JSON array of [key, args_json_text, group_key].
INSERT INTO oncebox_jobs
    (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at, created_at,
     schedule, period)
SELECT r.value ->> 0, :task, :queue, r.value ->> 1, :priority, r.value ->> 2, :max_attempts,
       COALESCE(:run_at, :now + :delay_us), :now + :max_age_us, :now, :schedule, :period
FROM json_each(:rows) AS r
WHERE r.value ->> 0 IS NULL
   OR NOT EXISTS (SELECT 1 FROM oncebox_intents i WHERE i.key = r.value ->> 0)
ON CONFLICT (key) WHERE state <> 'cancelled' DO NOTHING
RETURNING id, key;

-- name: job_enqueue_conflict
SELECT j.id, j.state, i.job_id, i.claimed_at
FROM (SELECT 1) AS one
LEFT JOIN oncebox_jobs j ON j.key = :key AND j.state <> 'cancelled'
LEFT JOIN oncebox_intents i ON i.key = :key;

-- name: job_lease
UPDATE oncebox_jobs
SET state = 'leased',
    attempt = attempt + 1,
    leased_by = :worker,
    leased_at = :now,
    lease_token = :token,
    lease_expires_at = :now + :lease_us
WHERE id IN (
    SELECT j.id
    FROM oncebox_jobs j
    WHERE j.state = 'ready'
      AND j.run_at <= :now
      AND j.task IN (SELECT value FROM json_each(:tasks))
      AND j.queue IN (SELECT value FROM json_each(:queues))
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM oncebox_jobs g
            WHERE g.group_key = j.group_key AND g.queue = j.queue
              AND g.state IN ('ready', 'leased') AND g.id <> j.id
              AND (g.state = 'leased' OR g.id < j.id)))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT :limit)
RETURNING id, key, task, queue, args, attempt, max_attempts, attempt_base, priority, group_key,
          run_at, created_at, expires_at, leased_at;

-- name: job_lease_extend
UPDATE oncebox_jobs
SET lease_expires_at = max(lease_expires_at, :now + :lease_us)
WHERE state = 'leased' AND lease_token IN (SELECT value FROM json_each(:tokens));

-- name: job_release
UPDATE oncebox_jobs
SET state = 'ready',
    attempt = attempt - 1,
    run_at = :now + :delay_us,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND lease_token = :token AND state = 'leased'
RETURNING id;

-- name: job_rescue_expired
UPDATE oncebox_jobs
SET state = CASE WHEN attempt - attempt_base >= max_attempts OR expires_at <= :now
                 THEN 'dead' ELSE 'ready' END,
    run_at = :now,
    finished_at = CASE WHEN attempt - attempt_base >= max_attempts OR expires_at <= :now
                       THEN :now END,
    last_error = 'lease expired: ' || COALESCE(leased_by, 'a worker')
        || ' did not finish attempt ' || attempt || ' before its lease ended at '
        || strftime('%Y-%m-%dT%H:%M:%SZ', lease_expires_at / 1000000, 'unixepoch'),
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id IN (
    SELECT id FROM oncebox_jobs
    WHERE state = 'leased' AND lease_expires_at < :now
    ORDER BY lease_expires_at
    LIMIT :limit)
RETURNING id, key, task, state, attempt, leased_by, leased_at, last_error;

-- name: job_rescue_expired__record
-- :rows is a JSON array of [job_id, attempt, worker, started_at, error].
INSERT INTO oncebox_job_attempts (job_id, attempt, worker, started_at, finished_at, outcome, error)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, :now, 'lease_expired',
       r.value ->> 4
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (job_id, attempt) DO NOTHING;

-- name: intent_claim
-- :claims is a JSON array of [key, task, job_id].
INSERT INTO oncebox_intents (key, task, job_id, claimed_at)
SELECT c.value ->> 0, c.value ->> 1, c.value ->> 2, :now
FROM json_each(:claims) AS c
WHERE true
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: intent_owner_list
SELECT key, job_id FROM oncebox_intents WHERE key IN (SELECT value FROM json_each(:keys));

-- name: intent_release
DELETE FROM oncebox_intents WHERE key IN (SELECT value FROM json_each(:keys));

-- name: job_finish
-- :rows is a JSON array of [id, state, outcome, delay_us, error].
UPDATE oncebox_jobs AS j
SET state = i.value ->> 1,
    outcome = i.value ->> 2,
    run_at = CASE WHEN i.value ->> 1 = 'ready' THEN :now + (i.value ->> 3) ELSE j.run_at END,
    finished_at = CASE WHEN i.value ->> 1 IN ('done', 'dead') THEN :now END,
    last_error = COALESCE(i.value ->> 4, j.last_error),
    lease_token = NULL,
    lease_expires_at = NULL
FROM json_each(:rows) AS i
WHERE j.id = i.value ->> 0 AND j.lease_token = :token AND j.state = 'leased'
RETURNING id, attempt, leased_by, leased_at, state, last_error;

-- name: job_finish__record
-- :rows is a JSON array of [job_id, attempt, worker, started_at, outcome, error].
INSERT INTO oncebox_job_attempts (job_id, attempt, worker, started_at, finished_at, outcome, error)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, :now, r.value ->> 4,
       r.value ->> 5
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (job_id, attempt) DO NOTHING;

-- name: job_attempt_note
INSERT INTO oncebox_job_attempts AS a
    (job_id, attempt, worker, started_at, finished_at, outcome, error, note)
VALUES (:job_id, :attempt, :worker, NULL, :now, 'superseded', NULL, :note)
ON CONFLICT (job_id, attempt) DO UPDATE
SET note = COALESCE(a.note || '; ', '') || excluded.note;

-- name: job_replay
UPDATE oncebox_jobs
SET state = 'ready', run_at = :now, attempt_base = attempt, finished_at = NULL
WHERE id = :id AND state = 'dead'
RETURNING id, key, task, attempt;

-- name: job_replay__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'replay', 'job', :id, :key, :reason,
        json_object('task', :task, 'attempts_before', :attempt))
RETURNING id;

-- name: job_cancel
UPDATE oncebox_jobs
SET state = 'cancelled', finished_at = :now
WHERE id = :id AND state = 'ready'
RETURNING id, key, task;

-- name: job_cancel__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'cancel', 'job', :id, :key, :reason, json_object('task', :task))
RETURNING id;

-- name: job_get
SELECT id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
       attempt_base, run_at, expires_at, created_at, leased_by, leased_at, lease_expires_at,
       finished_at, last_error, schedule, period
FROM oncebox_jobs WHERE id = :id;

-- name: job_find_by_key
SELECT id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
       attempt_base, run_at, expires_at, created_at, leased_by, leased_at, lease_expires_at,
       finished_at, last_error, schedule, period
FROM oncebox_jobs
WHERE (key = :key AND state <> 'cancelled')
   OR id = (SELECT job_id FROM oncebox_intents WHERE key = :key)
ORDER BY id;

-- name: job_attempt_list
SELECT job_id, attempt, worker, started_at, finished_at, outcome, error, note
FROM oncebox_job_attempts WHERE job_id = :id ORDER BY attempt;

-- name: job_count_by_state
SELECT state, COALESCE(outcome, ''), count(*) FROM oncebox_jobs GROUP BY 1, 2;

-- name: job_next_due
SELECT min(run_at), :now FROM oncebox_jobs
WHERE state = 'ready'
  AND task IN (SELECT value FROM json_each(:tasks))
  AND queue IN (SELECT value FROM json_each(:queues));

-- name: job_prune
DELETE FROM oncebox_jobs
WHERE id IN (
    SELECT id FROM oncebox_jobs
    WHERE state IN ('done', 'cancelled') AND finished_at < :now - :older_than_us
    ORDER BY id
    LIMIT :limit)
RETURNING id;

-- name: job_prune__attempts
DELETE FROM oncebox_job_attempts WHERE job_id IN (SELECT value FROM json_each(:ids));

-- name: intent_get
SELECT key, task, job_id, claimed_at FROM oncebox_intents WHERE key = :key;

-- name: intent_count
SELECT count(*) FROM oncebox_intents;

-- name: intent_prune
DELETE FROM oncebox_intents
WHERE key IN (
    SELECT key FROM oncebox_intents
    WHERE task = :task AND claimed_at < :now - :older_than_us
    ORDER BY claimed_at
    LIMIT :limit)
RETURNING key;

-- name: audit_list
SELECT id, at, actor, action, target_kind, target_id, target_key, reason, details
FROM oncebox_audit
WHERE (:target_id IS NULL OR target_id = :target_id)
  AND (:action IS NULL OR action = :action)
  AND (:key IS NULL OR target_key = :key)
  AND (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- ============================================================================================
-- The outbox
-- ============================================================================================

-- name: outbox_insert
-- :rows is a JSON array of [key, intent_key, channel, payload_json_text, token, job_id].
-- A key already in the outbox (its intent pruned by policy, then claimed again) is not re-sent.
INSERT INTO oncebox_outbox
    (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, r.value ->> 4, r.value ->> 5,
       :now, :now
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (key) DO NOTHING;

-- name: outbox_lease
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
RETURNING id, key, intent_key, channel, payload, token, attempt, attempt_base,
          possible_duplicates, first_leased_at, leased_at, uncertain;

-- name: outbox_next_due
SELECT (SELECT min((SELECT o.next_attempt_at FROM oncebox_outbox AS o
                    WHERE o.state = 'pending' AND o.channel = c.value
                    ORDER BY o.next_attempt_at
                    LIMIT 1))
        FROM json_each(:channels) AS c),
       :now;

-- name: outbox_mark_sending
UPDATE oncebox_outbox SET state = 'sending'
WHERE id = :id AND lease_token = :token AND state = 'leased'
RETURNING id;

-- name: outbox_finish
-- :rows is a JSON array of
-- [id, state, outcome, counts_attempt, delay_us, error, receipt, dup, uncertain (or null)].
UPDATE oncebox_outbox AS o
SET state = i.value ->> 1,
    attempt = o.attempt + (i.value ->> 3),
    possible_duplicates = o.possible_duplicates + (i.value ->> 7),
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
SELECT id, key, intent_key, channel, payload, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM oncebox_outbox
WHERE state IN ('leased', 'sending') AND lease_expires_at < :now
  AND channel IN (SELECT value FROM json_each(:channels))
ORDER BY lease_expires_at
LIMIT :limit;

-- name: outbox_resolve
UPDATE oncebox_outbox
SET state = CASE WHEN :resolution = 'sent' THEN 'sent' ELSE 'pending' END,
    sent_at = CASE WHEN :resolution = 'sent' THEN :now ELSE sent_at END,
    receipt = COALESCE(:receipt, receipt),
    next_attempt_at = :now,
    -- resend: the operator decided it was not delivered, so the next send is a first one
    uncertain = CASE WHEN :resolution = 'sent' THEN uncertain ELSE 0 END,
    first_leased_at = CASE WHEN :resolution = 'sent' THEN first_leased_at ELSE NULL END
WHERE id = :id AND state = 'ambiguous'
RETURNING id, key, channel;

-- name: outbox_resolve__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'resolve-' || :resolution, 'delivery', :id, :key, :reason,
        json_object('channel', :channel))
RETURNING id;

-- name: outbox_replay
UPDATE oncebox_outbox
SET state = 'pending', next_attempt_at = :now, attempt_base = attempt
WHERE id = :id AND state = 'dead'
RETURNING id, key, channel, attempt;

-- name: outbox_replay__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'replay', 'delivery', :id, :key, :reason,
        json_object('channel', :channel, 'attempts_before', :attempt))
RETURNING id;

-- name: outbox_get
SELECT id, key, intent_key, channel, payload, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM oncebox_outbox WHERE id = :id;

-- name: outbox_find_by_key
SELECT id, key, intent_key, channel, payload, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM oncebox_outbox WHERE key = :key OR intent_key = :key ORDER BY id;

-- name: outbox_ambiguous_list
SELECT id, key, intent_key, channel, payload, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM oncebox_outbox
WHERE state = 'ambiguous' AND channel IN (SELECT value FROM json_each(:channels))
ORDER BY id LIMIT :limit;

-- name: outbox_count_by_state
SELECT state, count(*) FROM oncebox_outbox GROUP BY state;

-- name: delivery_attempt_list
SELECT outbox_id, attempt, worker, started_at, finished_at, outcome, error, receipt
FROM oncebox_delivery_attempts WHERE outbox_id = :id ORDER BY id;

-- ============================================================================================
-- Rate limits, channel pauses, settings
-- ============================================================================================

-- name: rate_bucket_configure
-- :buckets is a JSON array of [name, capacity, refill_per_s].
INSERT INTO oncebox_rate_buckets AS rb (channel, name, capacity, refill_per_s, tokens, updated_at)
SELECT :channel, b.value ->> 0, b.value ->> 1, b.value ->> 2, b.value ->> 1, :now
FROM json_each(:buckets) AS b
WHERE true
ON CONFLICT (channel, name) DO UPDATE
SET capacity = excluded.capacity, refill_per_s = excluded.refill_per_s,
    tokens = min(rb.tokens, excluded.capacity);

-- name: rate_bucket_select
SELECT b.name, b.capacity, b.refill_per_s, b.tokens, b.updated_at, :now,
       (SELECT paused_until FROM oncebox_channel_pauses WHERE channel = :channel)
FROM oncebox_rate_buckets b
WHERE b.channel = :channel AND b.name IN (SELECT value FROM json_each(:names))
ORDER BY b.name;

-- name: rate_bucket_update
-- :buckets is a JSON array of [name, tokens, updated_at].
UPDATE oncebox_rate_buckets AS b
SET tokens = u.value ->> 1, updated_at = u.value ->> 2
FROM json_each(:buckets) AS u
WHERE b.channel = :channel AND b.name = u.value ->> 0;

-- name: channel_pause_read
SELECT :now, (SELECT paused_until FROM oncebox_channel_pauses WHERE channel = :channel);

-- name: channel_pause
INSERT INTO oncebox_channel_pauses AS p (channel, paused_until, reason)
VALUES (:channel, :now + :pause_us, :reason)
ON CONFLICT (channel) DO UPDATE
SET paused_until = max(p.paused_until, excluded.paused_until),
    reason = CASE WHEN excluded.paused_until > p.paused_until THEN excluded.reason
                  ELSE p.reason END
RETURNING paused_until;

-- name: setting_get
SELECT value FROM oncebox_settings WHERE name = :name;

-- name: setting_put_if_absent
INSERT INTO oncebox_settings (name, value) VALUES (:name, :value)
ON CONFLICT (name) DO NOTHING;

-- ============================================================================================
-- Schedules
-- ============================================================================================

-- name: schedule_state_get
SELECT paused, last_fire_at, :now FROM oncebox_schedules WHERE name = :name;

-- name: schedule_state_init
INSERT INTO oncebox_schedules (name, paused, last_fire_at, updated_at)
VALUES (:name, 0, :now - :grace_us, :now)
ON CONFLICT (name) DO NOTHING;

-- name: schedule_state_advance
UPDATE oncebox_schedules
SET last_fire_at = max(COALESCE(last_fire_at, :at), :at), updated_at = :now
WHERE name = :name;

-- name: schedule_state_pause
INSERT INTO oncebox_schedules AS s (name, paused, last_fire_at, updated_at)
VALUES (:name, :paused, :now, :now)
ON CONFLICT (name) DO UPDATE
SET paused = excluded.paused,
    last_fire_at = CASE WHEN excluded.paused THEN s.last_fire_at
                        ELSE max(s.last_fire_at, excluded.updated_at) END,
    updated_at = excluded.updated_at;

-- name: schedule_state_pause__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, CASE WHEN :paused THEN 'pause' ELSE 'resume' END, 'schedule', NULL, :name,
        :reason, NULL);

-- name: schedule_state_list
SELECT name, paused, last_fire_at FROM oncebox_schedules ORDER BY name;

-- name: schedule_run_claim
INSERT INTO oncebox_schedule_runs AS r
    (schedule, period, fire_at, state, owner, lease_expires_at, started_at, late)
VALUES (:schedule, :period, :fire_at, 'running', :owner, :now + :lease_us, :now, :late)
ON CONFLICT (schedule, period) DO UPDATE
SET state = 'running',
    owner = excluded.owner,
    lease_expires_at = excluded.lease_expires_at,
    started_at = excluded.started_at,
    finished_at = NULL
WHERE (r.state = 'running' AND r.lease_expires_at < excluded.started_at)
   OR (r.state = 'done' AND :rescan)
RETURNING owner;

-- name: schedule_run_extend
UPDATE oncebox_schedule_runs
SET lease_expires_at = :now + :lease_us, enqueued_count = enqueued_count + :enqueued
WHERE schedule = :schedule AND period = :period AND owner = :owner AND state = 'running'
RETURNING period;

-- name: schedule_run_finish
UPDATE oncebox_schedule_runs
SET state = 'done',
    finished_at = :now,
    lease_expires_at = NULL,
    scans = scans + 1,
    eligible_count = :eligible,
    enqueued_count = enqueued_count + :enqueued
WHERE schedule = :schedule AND period = :period AND owner = :owner AND state = 'running'
RETURNING period;

-- name: schedule_run_busy
SELECT period FROM oncebox_schedule_runs
WHERE schedule = :schedule AND state = 'running' AND period <> :period
  AND lease_expires_at >= :now
LIMIT 1;

-- name: schedule_run_list
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late
FROM oncebox_schedule_runs
WHERE schedule = :schedule
ORDER BY started_at DESC, period DESC
LIMIT :limit;

-- ============================================================================================
-- Status
-- ============================================================================================

-- name: status_times
SELECT
    (SELECT min(run_at) FROM oncebox_jobs WHERE state = 'ready' AND run_at <= :now),
    (SELECT min(run_at) FROM oncebox_jobs WHERE state = 'ready'),
    (SELECT min(next_attempt_at) FROM oncebox_outbox WHERE state = 'pending'),
    (SELECT min(created_at) FROM oncebox_outbox WHERE state = 'pending'),
    (SELECT min(lease_expires_at) FROM oncebox_jobs WHERE state = 'leased'),
    (SELECT min(lease_expires_at) FROM oncebox_outbox WHERE state IN ('leased', 'sending')),
    :now;

-- ============================================================================================
-- Operator listings (the CLI and the console): newest first, filtered, paged by id
-- ============================================================================================

-- name: job_list
SELECT id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
       attempt_base, run_at, expires_at, created_at, leased_by, leased_at, lease_expires_at,
       finished_at, last_error, schedule, period
FROM oncebox_jobs
WHERE (:state IS NULL OR state = :state)
  AND (:task IS NULL OR task = :task)
  AND (:queue IS NULL OR queue = :queue)
  AND (:schedule IS NULL OR schedule = :schedule)
  AND (:period IS NULL OR period = :period)
  AND (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- name: outbox_list
SELECT id, key, intent_key, channel, payload, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM oncebox_outbox
WHERE (:state IS NULL OR state = :state)
  AND (:channel IS NULL OR channel = :channel)
  AND (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- name: schedule_period_stats
-- See the PostgreSQL query.
WITH runs AS (
    SELECT period, state, eligible_count, enqueued_count
    FROM oncebox_schedule_runs
    WHERE schedule = :schedule
    ORDER BY period DESC
    LIMIT :limit
),
jobs AS (
    SELECT j.id, j.period, j.state
    FROM oncebox_jobs j
    WHERE j.schedule = :schedule AND j.period IN (SELECT period FROM runs)
),
messages AS (
    SELECT o.job_id,
           count(*) FILTER (WHERE o.state = 'sent') AS sent,
           count(*) FILTER (WHERE o.state IN ('pending', 'leased', 'sending')) AS pending,
           count(*) FILTER (WHERE o.state = 'dead') AS dead,
           count(*) FILTER (WHERE o.state = 'ambiguous') AS ambiguous,
           count(*) FILTER (WHERE o.state <> 'sent') AS unsent
    FROM oncebox_outbox o
    WHERE o.job_id IN (SELECT id FROM jobs)
    GROUP BY o.job_id
),
per_period AS (
    SELECT j.period,
           count(*) FILTER (WHERE j.state = 'done') AS done,
           count(*) FILTER (WHERE j.state = 'done' AND COALESCE(m.unsent, 0) = 0) AS covered,
           COALESCE(sum(m.sent), 0) AS sent,
           count(*) FILTER (WHERE j.state IN ('ready', 'leased')) + COALESCE(sum(m.pending), 0)
               AS pending,
           count(*) FILTER (WHERE j.state = 'dead') + COALESCE(sum(m.dead), 0) AS dead,
           COALESCE(sum(m.ambiguous), 0) AS ambiguous
    FROM jobs j LEFT JOIN messages m ON m.job_id = j.id
    GROUP BY j.period
)
SELECT r.period, r.state, r.eligible_count, r.enqueued_count,
       COALESCE(p.done, 0), COALESCE(p.covered, 0), COALESCE(p.sent, 0),
       COALESCE(p.pending, 0), COALESCE(p.dead, 0), COALESCE(p.ambiguous, 0)
FROM runs r LEFT JOIN per_period p ON p.period = r.period
ORDER BY r.period DESC;

-- ============================================================================================
-- The key-drift guard
-- ============================================================================================

-- name: key_canary_list
SELECT kind, name, source, outputs, recorded_at
FROM oncebox_key_canaries
ORDER BY kind, name;

-- name: key_canary_get
SELECT kind, name, source, outputs, recorded_at
FROM oncebox_key_canaries
WHERE kind = :kind AND name = :name;

-- name: key_canary_record
INSERT INTO oncebox_key_canaries (kind, name, source, outputs, recorded_at)
VALUES (:kind, :name, :source, :outputs, :now)
ON CONFLICT (kind, name) DO NOTHING;

-- name: key_canary_accept
INSERT INTO oncebox_key_canaries (kind, name, source, outputs, recorded_at)
VALUES (:kind, :name, :source, :outputs, :now)
ON CONFLICT (kind, name) DO UPDATE
    SET source = excluded.source, outputs = excluded.outputs, recorded_at = excluded.recorded_at
RETURNING name;

-- name: key_canary_accept__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'accept-keys', :kind, NULL, :name, :reason,
        json_object('was', :was, 'was_outputs', json(:was_outputs), 'now', :source,
                    'now_outputs', json(:outputs)))
RETURNING id;
