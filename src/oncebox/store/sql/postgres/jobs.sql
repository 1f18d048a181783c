-- oncebox queries for PostgreSQL. Blocks are named `-- name: x`; the SQLite file has the same
-- names. `__S__` is the schema, resolved at load time. Time is read only through oncebox_now(),
-- once per statement (a MATERIALIZED CTE), so every row of a statement sees the same instant.

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS __S__.oncebox_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_lock
-- Serialise concurrent `oncebox migrate` runs for the whole transaction.
SELECT pg_advisory_xact_lock(hashtext('oncebox_migrate:' || %(schema)s));

-- name: migration_list
SELECT version, name, checksum FROM __S__.oncebox_migrations ORDER BY version;

-- name: migration_record
INSERT INTO __S__.oncebox_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: clock_now
SELECT __S__.oncebox_now();

-- name: clock_read
SELECT frozen_at, offset_by FROM __S__.oncebox_clock WHERE singleton;

-- name: clock_write
INSERT INTO __S__.oncebox_clock (singleton, frozen_at, offset_by)
VALUES (true, %(frozen_at)s, %(offset_by)s)
ON CONFLICT (singleton) DO UPDATE
SET frozen_at = excluded.frozen_at, offset_by = excluded.offset_by;

-- name: clock_reset
DELETE FROM __S__.oncebox_clock;

-- name: job_notify
-- Wake idle workers after rows became ready without an insert (replay, release, rescue).
SELECT pg_notify('oncebox_jobs', %(schema)s);

-- name: job_insert
-- One job, unless its key already has an intent or a job that is not cancelled; then nothing
-- is written and no row is returned.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_jobs
    (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at, created_at)
SELECT %(key)s, %(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(group_key)s,
       %(max_attempts)s,
       COALESCE(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay_s)s)),
       clock.now + make_interval(secs => %(max_age_s)s),
       clock.now
FROM clock
WHERE %(key)s::text IS NULL
   OR NOT EXISTS (SELECT 1 FROM __S__.oncebox_intents i WHERE i.key = %(key)s::text)
ON CONFLICT (key) WHERE state <> 'cancelled' DO NOTHING
RETURNING id, state;

-- name: job_insert_many
-- Many jobs of one task in one statement; rows whose key is claimed or active are skipped.
-- %(rows)s is a JSON array of [key, args, group key].
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
rows AS (
    SELECT r ->> 0 AS key, r -> 1 AS args, r ->> 2 AS group_key
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
)
INSERT INTO __S__.oncebox_jobs
    (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at, created_at,
     schedule, period)
SELECT r.key, %(task)s, %(queue)s, r.args, %(priority)s, r.group_key, %(max_attempts)s,
       COALESCE(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay_s)s)),
       clock.now + make_interval(secs => %(max_age_s)s),
       clock.now, %(schedule)s, %(period)s
FROM rows r, clock
WHERE r.key IS NULL
   OR NOT EXISTS (SELECT 1 FROM __S__.oncebox_intents i WHERE i.key = r.key)
ON CONFLICT (key) WHERE state <> 'cancelled' DO NOTHING
RETURNING id, key;

-- name: job_enqueue_conflict
-- Why an insert wrote nothing: the job holding the key, and/or the key's intent.
SELECT j.id, j.state, i.job_id, i.claimed_at
FROM (SELECT 1) AS one
LEFT JOIN __S__.oncebox_jobs j
       ON j.key = %(key)s AND j.state <> 'cancelled'
LEFT JOIN __S__.oncebox_intents i ON i.key = %(key)s;

-- name: job_lease_settings
-- Run before job_lease, in its transaction.
-- Planner: the lease must walk the claim index in order and stop at the limit. Right after a bulk
-- enqueue the statistics still say the table has no ready jobs, and the planner then prefers to
-- collect every ready job and sort them — per lease, O(backlog).
-- Commit: the lease does not wait for its WAL flush. Only a crash of the server itself can lose
-- it, and then the job is simply ready again with its attempt unspent; the consumer transaction
-- that follows commits synchronously, and its flush covers the lease's earlier WAL, so no claim,
-- outbox row or settlement is ever durable while its lease is not. It saves one disk flush per
-- batch (about 4 ms on the benchmark machine: half the pick-up latency at low load).
-- JIT: a plan the settings above penalise would cost enough to be compiled, for 0.4 s per lease.
SELECT set_config('enable_sort', 'off', true), set_config('enable_bitmapscan', 'off', true),
       set_config('synchronous_commit', 'off', true), set_config('jit', 'off', true);

-- name: job_lease
-- Lease up to %(limit)s due ready jobs of the given tasks and queues under one owner token.
-- Ordered groups: a job is eligible only if its group has no leased job and no ready job
-- enqueued before it. SKIP LOCKED lets concurrent workers pass each other's candidates.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
picked AS (
    SELECT j.id
    FROM __S__.oncebox_jobs j
    WHERE j.state = 'ready'
      AND j.run_at <= (SELECT now FROM clock)
      AND j.task = ANY(%(tasks)s::text[])
      AND j.queue = ANY(%(queues)s::text[])
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM __S__.oncebox_jobs g
            WHERE g.group_key = j.group_key AND g.queue = j.queue
              AND g.state IN ('ready', 'leased') AND g.id <> j.id
              AND (g.state = 'leased' OR g.id < j.id)))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE __S__.oncebox_jobs j
SET state = 'leased',
    attempt = j.attempt + 1,
    leased_by = %(worker)s,
    leased_at = clock.now,
    lease_token = %(token)s,
    lease_expires_at = clock.now + make_interval(secs => %(lease_s)s)
FROM picked, clock
WHERE j.id = picked.id
RETURNING j.id, j.key, j.task, j.queue, j.args::text, j.attempt, j.max_attempts, j.attempt_base,
          j.priority, j.group_key, j.run_at, j.created_at, j.expires_at, clock.now;

-- name: job_lease_extend
-- Heartbeat: push the deadline of live leases out (never earlier); never revives an ended lease.
-- A row locked right now is skipped: its consumer transaction is settling it. Waiting for it
-- while holding the rows this statement already updated would deadlock with that settlement,
-- which takes its rows in its own order; skipped, a row keeps a deadline at least two thirds of
-- a lease away, and the next beat extends it if the settlement rolled back.
UPDATE __S__.oncebox_jobs
SET lease_expires_at = GREATEST(lease_expires_at,
    (SELECT __S__.oncebox_now()) + make_interval(secs => %(lease_s)s))
WHERE id IN (SELECT id FROM __S__.oncebox_jobs
             WHERE state = 'leased' AND lease_token = ANY(%(tokens)s::uuid[])
             FOR UPDATE SKIP LOCKED);

-- name: job_release
-- Give leased jobs back without spending an attempt (shutdown, lock timeout on the claim).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
UPDATE __S__.oncebox_jobs j
SET state = 'ready',
    attempt = j.attempt - 1,
    run_at = clock.now + make_interval(secs => %(delay_s)s),
    lease_token = NULL,
    lease_expires_at = NULL
FROM clock
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.lease_token = %(token)s AND j.state = 'leased'
RETURNING j.id;

-- name: job_rescue_expired
-- Leases past their deadline: the attempt is recorded as lease_expired, and the job becomes
-- ready again, or dead when its attempts or max age are spent.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
expired AS (
    SELECT id FROM __S__.oncebox_jobs
    WHERE state = 'leased' AND lease_expires_at < (SELECT now FROM clock)
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
rescued AS (
    UPDATE __S__.oncebox_jobs j
    SET state = CASE
            WHEN j.attempt - j.attempt_base >= j.max_attempts
              OR j.expires_at <= clock.now THEN 'dead'
            ELSE 'ready' END,
        run_at = clock.now,
        finished_at = CASE
            WHEN j.attempt - j.attempt_base >= j.max_attempts
              OR j.expires_at <= clock.now THEN clock.now END,
        last_error = 'lease expired: ' || COALESCE(j.leased_by, 'a worker')
            || ' did not finish attempt ' || j.attempt || ' before its lease ended at '
            || to_char(j.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM expired, clock
    WHERE j.id = expired.id
    RETURNING j.id, j.key, j.task, j.state, j.attempt, j.leased_by, j.leased_at, j.last_error,
              clock.now
),
recorded AS (
    INSERT INTO __S__.oncebox_job_attempts
        (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempt, leased_by, leased_at, now, 'lease_expired', last_error FROM rescued
    ON CONFLICT (job_id, attempt) DO NOTHING
)
SELECT id, key, task, state, attempt, leased_by FROM rescued;

-- name: intent_claim
-- The claim: insert each key's intent; keys already claimed (by anyone, ever) are not returned.
-- Waits at most lock_timeout for a key another live transaction is claiming.
-- %(claims)s is a JSON array of [key, task, job id].
INSERT INTO __S__.oncebox_intents (key, task, job_id, claimed_at)
SELECT c ->> 0, c ->> 1, (c ->> 2)::bigint, (SELECT __S__.oncebox_now())
FROM jsonb_array_elements(%(claims)s::jsonb) AS c
ON CONFLICT (key) DO NOTHING
RETURNING key;

-- name: intent_owner_list
-- Who claimed these keys: a job whose own earlier claim committed (and whose settlement did not)
-- is completed, not a duplicate.
SELECT key, job_id FROM __S__.oncebox_intents WHERE key = ANY(%(keys)s::text[]);

-- name: intent_release
-- Undo claims made earlier in this same transaction (their handler failed or did not run).
DELETE FROM __S__.oncebox_intents WHERE key = ANY(%(keys)s::text[]);

-- name: job_finish
-- Settle leased jobs of one lease, fenced on its token: done (completed | duplicate), ready again
-- after a delay (failed attempt), or dead. Failed attempts are recorded. Returns the ids settled;
-- a job whose lease was superseded is not among them.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
input AS (  -- %(finishes)s is a JSON array of [id, state, outcome, delay in s, error]
    SELECT (f ->> 0)::bigint AS id, f ->> 1 AS state, f ->> 2 AS outcome,
           (f ->> 3)::float8 AS delay_s, f ->> 4 AS error
    FROM jsonb_array_elements(%(finishes)s::jsonb) AS f
),
settled AS (
    UPDATE __S__.oncebox_jobs j
    SET state = i.state,
        outcome = i.outcome,
        run_at = CASE WHEN i.state = 'ready'
                      THEN clock.now + make_interval(secs => i.delay_s) ELSE j.run_at END,
        finished_at = CASE WHEN i.state IN ('done', 'dead') THEN clock.now END,
        last_error = COALESCE(i.error, j.last_error),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM input i, clock
    -- no `state = 'leased'`: the token implies it (a CHECK constraint), and it would let the
    -- planner read the leased index, whose dead entries grow with every lease until a vacuum,
    -- instead of looking each id up by primary key
    WHERE j.id = i.id AND j.lease_token = %(token)s
    RETURNING j.id, j.attempt, j.leased_by, j.leased_at, j.state, i.error, clock.now
),
recorded AS (
    INSERT INTO __S__.oncebox_job_attempts
        (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempt, leased_by, leased_at, now,
           CASE WHEN state = 'dead' THEN 'dead' ELSE 'failed' END, error
    FROM settled WHERE state <> 'done'
    ON CONFLICT (job_id, attempt) DO NOTHING
)
SELECT id FROM settled;

-- name: job_attempt_note
-- Record, outside the refused transaction, that a superseded worker tried to commit.
INSERT INTO __S__.oncebox_job_attempts AS a
    (job_id, attempt, worker, started_at, finished_at, outcome, error, note)
VALUES (%(job_id)s, %(attempt)s, %(worker)s, NULL, (SELECT __S__.oncebox_now()), 'superseded',
        NULL, %(note)s)
ON CONFLICT (job_id, attempt) DO UPDATE
SET note = COALESCE(a.note || '; ', '') || excluded.note;

-- name: job_replay
-- Dead → ready in place: same id, same key; the retry budget restarts; audited in the same
-- statement (so in the same transaction).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
replayed AS (
    UPDATE __S__.oncebox_jobs j
    SET state = 'ready', run_at = clock.now, attempt_base = j.attempt, finished_at = NULL
    FROM clock
    WHERE j.id = %(id)s AND j.state = 'dead'
    RETURNING j.id, j.key, j.task, j.attempt, clock.now
),
audited AS (
    INSERT INTO __S__.oncebox_audit
        (at, actor, action, target_kind, target_id, target_key, reason, details)
    SELECT now, %(actor)s, 'replay', 'job', id, key, %(reason)s,
           jsonb_build_object('task', task, 'attempts_before', attempt)
    FROM replayed
    RETURNING id
)
SELECT r.id, r.key, a.id FROM replayed r, audited a;

-- name: job_cancel
-- Ready → cancelled (a durable timer withdrawn), audited in the same statement.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
cancelled AS (
    UPDATE __S__.oncebox_jobs j
    SET state = 'cancelled', finished_at = clock.now
    FROM clock
    WHERE j.id = %(id)s AND j.state = 'ready'
    RETURNING j.id, j.key, j.task, clock.now
),
audited AS (
    INSERT INTO __S__.oncebox_audit
        (at, actor, action, target_kind, target_id, target_key, reason, details)
    SELECT now, %(actor)s, 'cancel', 'job', id, key, %(reason)s,
           jsonb_build_object('task', task)
    FROM cancelled
    RETURNING id
)
SELECT c.id, c.key, a.id FROM cancelled c, audited a;

-- name: job_get
SELECT id, key, task, queue, args::text, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM __S__.oncebox_jobs WHERE id = %(id)s;

-- name: job_find_by_key
-- The job holding this key (any state but cancelled), and the job that claimed its intent.
SELECT id, key, task, queue, args::text, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM __S__.oncebox_jobs
WHERE (key = %(key)s AND state <> 'cancelled')
   OR id = (SELECT job_id FROM __S__.oncebox_intents WHERE key = %(key)s)
ORDER BY id;

-- name: job_attempt_list
SELECT job_id, attempt, worker, started_at, finished_at, outcome, error, note
FROM __S__.oncebox_job_attempts WHERE job_id = %(id)s ORDER BY attempt;

-- name: job_count_by_state
SELECT state, COALESCE(outcome, ''), count(*) FROM __S__.oncebox_jobs GROUP BY 1, 2;

-- name: job_next_due
-- When the earliest ready job of these tasks and queues falls due (NULL if none), and the time now.
-- The first match in the due index's order, not min(): with stale statistics the planner would
-- aggregate over every ready job (0.6 s at a 1 000 000-job backlog).
SELECT (SELECT run_at FROM __S__.oncebox_jobs
         WHERE state = 'ready' AND task = ANY(%(tasks)s::text[])
           AND queue = ANY(%(queues)s::text[])
         ORDER BY run_at LIMIT 1),
       (SELECT __S__.oncebox_now());

-- name: job_prune
-- Delete a batch of done and cancelled jobs finished before the cutoff, with their attempts.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT id FROM __S__.oncebox_jobs
    WHERE state IN ('done', 'cancelled')
      AND finished_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
attempts AS (
    DELETE FROM __S__.oncebox_job_attempts a USING doomed d WHERE a.job_id = d.id
)
DELETE FROM __S__.oncebox_jobs j USING doomed d WHERE j.id = d.id RETURNING j.id;

-- name: intent_get
SELECT key, task, job_id, claimed_at FROM __S__.oncebox_intents WHERE key = %(key)s;

-- name: intent_count
SELECT count(*) FROM __S__.oncebox_intents;

-- name: intent_prune
-- A task's explicit intent-retention policy: delete a batch of its intents claimed before the
-- cutoff. Never run as a side effect of pruning jobs.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT key FROM __S__.oncebox_intents
    WHERE task = %(task)s
      AND claimed_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
    ORDER BY claimed_at
    LIMIT %(limit)s
)
DELETE FROM __S__.oncebox_intents i USING doomed d WHERE i.key = d.key RETURNING i.key;

-- name: audit_list
SELECT id, at, actor, action, target_kind, target_id, target_key, reason, details::text
FROM __S__.oncebox_audit
WHERE (%(target_id)s::bigint IS NULL OR target_id = %(target_id)s::bigint)
  AND (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(key)s::text IS NULL OR target_key = %(key)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- ============================================================================================
-- The outbox
-- ============================================================================================

-- name: outbox_insert
-- The handlers' buffered rows of one consumer transaction, as one set. A key already in the
-- outbox (its intent pruned by policy, then claimed again) is not re-sent.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_outbox
    (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at)
SELECT r ->> 0, r ->> 1, r ->> 2, r -> 3, r ->> 4, (r ->> 5)::bigint, clock.now, clock.now
FROM jsonb_array_elements(%(rows)s::jsonb) AS r, clock  -- [key, intent key, channel, payload,
ON CONFLICT (key) DO NOTHING;                             -- token, job id] per row

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
FROM picked, clock
WHERE o.id = picked.id
RETURNING o.id, o.key, o.intent_key, o.channel, o.payload::text, o.token, o.attempt,
          o.attempt_base, o.possible_duplicates, o.first_leased_at, clock.now, o.uncertain;

-- name: outbox_next_due
-- When the earliest pending row of these channels falls due (NULL if none), and the time now:
-- how long an idle dispatcher may wait (a retry's backoff, a rate limit's give-back, a pause).
-- Each channel's head is read from the due index, as the lease reads it.
SELECT (SELECT min(head.next_attempt_at)
        FROM unnest(%(channels)s::text[]) AS c(channel)
        CROSS JOIN LATERAL (
            SELECT o.next_attempt_at FROM __S__.oncebox_outbox o
            WHERE o.state = 'pending' AND o.channel = c.channel
            ORDER BY o.next_attempt_at
            LIMIT 1
        ) AS head),
       (SELECT __S__.oncebox_now());

-- name: outbox_mark_sending
-- The one durable write before a send through a channel without provider idempotency.
UPDATE __S__.oncebox_outbox SET state = 'sending'
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'leased'
RETURNING id;

-- name: outbox_finish
-- Settle rows of one lease, fenced on its token, and record the delivery attempts.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
input AS (  -- %(finishes)s: [id, state, outcome, counts, delay in s, error, receipt, dup,
            -- uncertain] per row
    SELECT (f ->> 0)::bigint AS id, f ->> 1 AS state, f ->> 2 AS outcome,
           (f ->> 3)::bool AS counts, (f ->> 4)::float8 AS delay_s, f ->> 5 AS error,
           f ->> 6 AS receipt, (f ->> 7)::bool AS dup, (f ->> 8)::bool AS uncertain
    FROM jsonb_array_elements(%(finishes)s::jsonb) AS f
),
settled AS (
    UPDATE __S__.oncebox_outbox o
    SET state = i.state,
        attempt = o.attempt + CASE WHEN i.counts THEN 1 ELSE 0 END,
        possible_duplicates = o.possible_duplicates + CASE WHEN i.dup THEN 1 ELSE 0 END,
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
    -- the token implies a leased or sending row (a CHECK constraint); see job_finish
    WHERE o.id = i.id AND o.lease_token = %(token)s
    RETURNING o.id, o.attempt, o.leased_by, o.leased_at, i.outcome, i.error, i.receipt,
              clock.now
),
recorded AS (
    INSERT INTO __S__.oncebox_delivery_attempts
        (outbox_id, attempt, worker, started_at, finished_at, outcome, error, receipt)
    SELECT id, attempt, leased_by, leased_at, now, outcome, error, receipt
    FROM settled WHERE outcome IS NOT NULL
)
SELECT id FROM settled;

-- name: outbox_rescue_select
-- Rows whose lease expired, locked for the rescue's decision (the caller's transaction).
SELECT id, key, intent_key, channel, payload::text, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token::text, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM __S__.oncebox_outbox
WHERE state IN ('leased', 'sending') AND lease_expires_at < (SELECT __S__.oncebox_now())
  AND channel = ANY(%(channels)s::text[])
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: outbox_resolve
-- Ambiguous → sent (the provider has it) or pending (resend now), audited in the same statement.
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
SELECT r.id, r.key, a.id FROM resolved r, audited a;

-- name: outbox_replay
-- Dead → pending in place: same key, same frozen content; audited in the same statement.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
replayed AS (
    UPDATE __S__.oncebox_outbox o
    SET state = 'pending', next_attempt_at = clock.now, attempt_base = o.attempt
    FROM clock
    WHERE o.id = %(id)s AND o.state = 'dead'
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
SELECT r.id, r.key, a.id FROM replayed r, audited a;

-- name: outbox_get
SELECT id, key, intent_key, channel, payload::text, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token::text, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM __S__.oncebox_outbox WHERE id = %(id)s;

-- name: outbox_find_by_key
SELECT id, key, intent_key, channel, payload::text, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token::text, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM __S__.oncebox_outbox WHERE key = %(key)s OR intent_key = %(key)s ORDER BY id;

-- name: outbox_ambiguous_list
SELECT id, key, intent_key, channel, payload::text, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token::text, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM __S__.oncebox_outbox
WHERE state = 'ambiguous' AND channel = ANY(%(channels)s::text[])
ORDER BY id LIMIT %(limit)s;

-- name: outbox_count_by_state
SELECT state, count(*) FROM __S__.oncebox_outbox GROUP BY state;

-- name: delivery_attempt_list
SELECT outbox_id, attempt, worker, started_at, finished_at, outcome, error, receipt
FROM __S__.oncebox_delivery_attempts WHERE outbox_id = %(id)s ORDER BY id;

-- ============================================================================================
-- Rate limits, channel pauses, settings
-- ============================================================================================

-- name: rate_bucket_configure
-- Create missing buckets full; follow configuration changes of capacity and refill rate.
INSERT INTO __S__.oncebox_rate_buckets AS rb
    (channel, name, capacity, refill_per_s, tokens, updated_at)
SELECT %(channel)s, b.name, b.capacity, b.refill, b.capacity, (SELECT __S__.oncebox_now())
FROM unnest(%(names)s::text[], %(capacities)s::float8[], %(refills)s::float8[])
    AS b(name, capacity, refill)
ON CONFLICT (channel, name) DO UPDATE
SET capacity = excluded.capacity, refill_per_s = excluded.refill_per_s,
    tokens = LEAST(rb.tokens, excluded.capacity);

-- name: rate_bucket_select
-- The channel's buckets, locked until the caller's transaction ends, with the clock and pause.
SELECT b.name, b.capacity, b.refill_per_s, b.tokens, b.updated_at,
       (SELECT __S__.oncebox_now()),
       (SELECT paused_until FROM __S__.oncebox_channel_pauses WHERE channel = %(channel)s)
FROM __S__.oncebox_rate_buckets b
WHERE b.channel = %(channel)s AND b.name = ANY(%(names)s::text[])
ORDER BY b.name
FOR UPDATE OF b;

-- name: rate_bucket_update
UPDATE __S__.oncebox_rate_buckets b
SET tokens = u.tokens, updated_at = u.updated_at
FROM unnest(%(names)s::text[], %(tokens)s::float8[], %(updated)s::timestamptz[])
    AS u(name, tokens, updated_at)
WHERE b.channel = %(channel)s AND b.name = u.name;

-- name: channel_pause_read
SELECT (SELECT __S__.oncebox_now()),
       (SELECT paused_until FROM __S__.oncebox_channel_pauses WHERE channel = %(channel)s);

-- name: channel_pause
-- Pause a channel for everyone until now + pause_s; a longer pause already in place stays.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_channel_pauses AS p (channel, paused_until, reason)
SELECT %(channel)s, clock.now + make_interval(secs => %(pause_s)s), %(reason)s FROM clock
ON CONFLICT (channel) DO UPDATE
SET paused_until = GREATEST(p.paused_until, excluded.paused_until),
    reason = CASE WHEN excluded.paused_until > p.paused_until THEN excluded.reason
                  ELSE p.reason END
RETURNING paused_until;

-- name: setting_get
SELECT value FROM __S__.oncebox_settings WHERE name = %(name)s;

-- name: setting_put_if_absent
INSERT INTO __S__.oncebox_settings (name, value) VALUES (%(name)s, %(value)s)
ON CONFLICT (name) DO NOTHING;

-- ============================================================================================
-- Schedules
-- ============================================================================================

-- name: schedule_state_get
SELECT paused, last_fire_at, (SELECT __S__.oncebox_now())
FROM __S__.oncebox_schedules WHERE name = %(name)s;

-- name: schedule_state_init
-- First sight of a schedule: it starts `grace` ago (a fire that just passed still runs), not at
-- the beginning of time (no backfill of a history it never had).
INSERT INTO __S__.oncebox_schedules (name, paused, last_fire_at, updated_at)
SELECT %(name)s, false, c.now - make_interval(secs => %(grace_s)s), c.now
FROM (SELECT __S__.oncebox_now() AS now) c
ON CONFLICT (name) DO NOTHING;

-- name: schedule_state_advance
UPDATE __S__.oncebox_schedules
SET last_fire_at = GREATEST(COALESCE(last_fire_at, %(at)s), %(at)s),
    updated_at = (SELECT __S__.oncebox_now())
WHERE name = %(name)s;

-- name: schedule_state_pause
-- Pause or resume; resuming starts from now: fires missed while paused are skipped on purpose.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_schedules AS s (name, paused, last_fire_at, updated_at)
SELECT %(name)s, %(paused)s, clock.now, clock.now FROM clock
ON CONFLICT (name) DO UPDATE
SET paused = excluded.paused,
    last_fire_at = CASE WHEN excluded.paused THEN s.last_fire_at
                        ELSE GREATEST(s.last_fire_at, excluded.updated_at) END,
    updated_at = excluded.updated_at;

-- name: schedule_state_pause__audit
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (__S__.oncebox_now(), %(actor)s, CASE WHEN %(paused)s THEN 'pause' ELSE 'resume' END,
        'schedule', NULL, %(name)s, %(reason)s, NULL);

-- name: schedule_state_list
SELECT name, paused, last_fire_at FROM __S__.oncebox_schedules ORDER BY name;

-- name: schedule_run_claim
-- Take a period's fan-out: a new run, a run whose owner's lease ran out, or — a manual re-run —
-- a finished one. Returns a row only when this owner now has it.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_schedule_runs AS r
    (schedule, period, fire_at, state, owner, lease_expires_at, started_at, late)
SELECT %(schedule)s, %(period)s, %(fire_at)s::timestamptz, 'running', %(owner)s,
       clock.now + make_interval(secs => %(lease_s)s), clock.now, %(late)s
FROM clock
ON CONFLICT (schedule, period) DO UPDATE
SET state = 'running',
    owner = excluded.owner,
    lease_expires_at = excluded.lease_expires_at,
    started_at = excluded.started_at,
    finished_at = NULL
WHERE (r.state = 'running' AND r.lease_expires_at < excluded.started_at)
   OR (r.state = 'done' AND %(rescan)s)
RETURNING r.owner;

-- name: schedule_run_extend
-- Between batches: keep the lease, count what was enqueued; nothing if the run was taken over.
UPDATE __S__.oncebox_schedule_runs
SET lease_expires_at = (SELECT __S__.oncebox_now()) + make_interval(secs => %(lease_s)s),
    enqueued_count = enqueued_count + %(enqueued)s
WHERE schedule = %(schedule)s AND period = %(period)s AND owner = %(owner)s
  AND state = 'running'
RETURNING period;

-- name: schedule_run_finish
UPDATE __S__.oncebox_schedule_runs
SET state = 'done',
    finished_at = (SELECT __S__.oncebox_now()),
    lease_expires_at = NULL,
    scans = scans + 1,
    eligible_count = %(eligible)s,
    enqueued_count = enqueued_count + %(enqueued)s
WHERE schedule = %(schedule)s AND period = %(period)s AND owner = %(owner)s
  AND state = 'running'
RETURNING period;

-- name: schedule_run_busy
-- Another period of this schedule whose fan-out is still running (a live lease).
SELECT period FROM __S__.oncebox_schedule_runs
WHERE schedule = %(schedule)s AND state = 'running' AND period <> %(period)s
  AND lease_expires_at >= (SELECT __S__.oncebox_now())
LIMIT 1;

-- name: schedule_run_list
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late
FROM __S__.oncebox_schedule_runs
WHERE schedule = %(schedule)s
ORDER BY started_at DESC, period DESC
LIMIT %(limit)s;

-- ============================================================================================
-- Status
-- ============================================================================================

-- name: status_times
-- The instants operators and the demo watch: the oldest due ready job, the next job and message
-- to fall due, the oldest pending message, the next lease to run out.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT
    (SELECT min(run_at) FROM __S__.oncebox_jobs
      WHERE state = 'ready' AND run_at <= (SELECT now FROM clock)),
    (SELECT min(run_at) FROM __S__.oncebox_jobs WHERE state = 'ready'),
    (SELECT min(next_attempt_at) FROM __S__.oncebox_outbox WHERE state = 'pending'),
    (SELECT min(created_at) FROM __S__.oncebox_outbox WHERE state = 'pending'),
    (SELECT min(lease_expires_at) FROM __S__.oncebox_jobs WHERE state = 'leased'),
    (SELECT min(lease_expires_at) FROM __S__.oncebox_outbox
      WHERE state IN ('leased', 'sending')),
    (SELECT now FROM clock);

-- ============================================================================================
-- Operator listings (the CLI and the console): newest first, filtered, paged by id
-- ============================================================================================

-- name: job_list
SELECT id, key, task, queue, args::text, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM __S__.oncebox_jobs
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(schedule)s::text IS NULL OR schedule = %(schedule)s::text)
  AND (%(period)s::text IS NULL OR period = %(period)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: outbox_list
SELECT id, key, intent_key, channel, payload::text, token, job_id, state, attempt, attempt_base,
       possible_duplicates, next_attempt_at, created_at, first_leased_at, leased_by,
       lease_token::text, lease_expires_at, sent_at, receipt, last_error, uncertain
FROM __S__.oncebox_outbox
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(channel)s::text IS NULL OR channel = %(channel)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: schedule_period_stats
-- Per period of one schedule (the latest periods first): the latest scan's eligible count, what
-- the fan-outs enqueued, and where those jobs and their messages are now, in one pass over the
-- periods' jobs and their messages (oncebox_outbox_job). A job is *covered* when it is done and
-- every message it wrote is sent.
WITH runs AS (
    SELECT period, state, eligible_count, enqueued_count
    FROM __S__.oncebox_schedule_runs
    WHERE schedule = %(schedule)s
    ORDER BY period DESC
    LIMIT %(limit)s
),
jobs AS (
    SELECT j.id, j.period, j.state
    FROM __S__.oncebox_jobs j
    WHERE j.schedule = %(schedule)s AND j.period IN (SELECT period FROM runs)
),
messages AS (
    SELECT o.job_id,
           count(*) FILTER (WHERE o.state = 'sent') AS sent,
           count(*) FILTER (WHERE o.state IN ('pending', 'leased', 'sending')) AS pending,
           count(*) FILTER (WHERE o.state = 'dead') AS dead,
           count(*) FILTER (WHERE o.state = 'ambiguous') AS ambiguous,
           count(*) FILTER (WHERE o.state <> 'sent') AS unsent
    FROM __S__.oncebox_outbox o
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
SELECT kind, name, source, outputs::text, recorded_at
FROM __S__.oncebox_key_canaries
ORDER BY kind, name;

-- name: key_canary_get
SELECT kind, name, source, outputs::text, recorded_at
FROM __S__.oncebox_key_canaries
WHERE kind = %(kind)s AND name = %(name)s;

-- name: key_canary_record
-- First sight of a template or period function: record it, unless another process just did.
INSERT INTO __S__.oncebox_key_canaries (kind, name, source, outputs, recorded_at)
VALUES (%(kind)s, %(name)s, %(source)s, %(outputs)s::jsonb, __S__.oncebox_now())
ON CONFLICT (kind, name) DO NOTHING;

-- name: key_canary_accept
-- An operator accepts the code's current canaries, audited in the same statement.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
previous AS (
    SELECT source, outputs FROM __S__.oncebox_key_canaries
    WHERE kind = %(kind)s AND name = %(name)s
),
accepted AS (
    INSERT INTO __S__.oncebox_key_canaries (kind, name, source, outputs, recorded_at)
    SELECT %(kind)s, %(name)s, %(source)s, %(outputs)s::jsonb, now FROM clock
    ON CONFLICT (kind, name) DO UPDATE
        SET source = EXCLUDED.source, outputs = EXCLUDED.outputs,
            recorded_at = EXCLUDED.recorded_at
    RETURNING name
)
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
SELECT clock.now, %(actor)s, 'accept-keys', %(kind)s, NULL, %(name)s, %(reason)s,
       jsonb_build_object('was', (SELECT source FROM previous),
                          'was_outputs', (SELECT outputs FROM previous),
                          'now', %(source)s::text, 'now_outputs', %(outputs)s::jsonb)
FROM clock, accepted
RETURNING id;
