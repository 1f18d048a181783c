-- Jobs: enqueue, lease, settle, rescue, replay, read, prune.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: job_notify
-- Wake idle workers after rows became ready without an insert (replay, release, rescue).
SELECT pg_notify('oncebox_jobs', %(schema)s);

-- name: work_listen
-- An idle worker's listener: woken by every schema's job_notify and outbox_notify (and the insert
-- triggers that send the same), it keeps its own schema's; the channel says which lanes to wake.
LISTEN oncebox_jobs; LISTEN oncebox_outbox;

-- name: job_insert
-- One job, unless its key already has an intent or a job that is not cancelled; then nothing
-- is written and no row is returned. Either way it is counted (counters.sql). %(state)s is
-- 'ready', or 'relayed' for a queue a broker holds (0016: the trigger writes its publish).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
inserted AS (
    INSERT INTO __S__.oncebox_jobs
        (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at,
         created_at, trace_context, limit_key, state)
    SELECT %(key)s, %(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(group_key)s,
           %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay_s)s)),
           clock.now + make_interval(secs => %(max_age_s)s),
           clock.now, %(trace_context)s, %(limit_key)s, %(state)s
    FROM clock
    WHERE %(key)s::text IS NULL
       OR NOT EXISTS (SELECT 1 FROM __S__.oncebox_intents i WHERE i.key = %(key)s::text)
    ON CONFLICT (key) WHERE stage <> 'cancelled' DO NOTHING
    RETURNING id, state
),
counted AS (
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT CASE WHEN EXISTS (SELECT 1 FROM inserted) THEN 'jobs_enqueued'
                ELSE 'enqueue_duplicates' END,
           pg_backend_pid(), 1
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id, state FROM inserted;

-- name: job_insert_many
-- Many jobs of one task in one statement; rows whose key is claimed or active are skipped.
-- %(rows)s is a JSON array of [key, args, group key, limit key]. Created and skipped rows are
-- counted.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
rows AS (
    SELECT r ->> 0 AS key, r -> 1 AS args, r ->> 2 AS group_key, r ->> 3 AS limit_key
    FROM jsonb_array_elements(%(rows)s::jsonb) AS r
),
inserted AS (
    INSERT INTO __S__.oncebox_jobs
        (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at,
         created_at, schedule, period, trace_context, limit_key, state)
    SELECT r.key, %(task)s, %(queue)s, r.args, %(priority)s, r.group_key, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, clock.now + make_interval(secs => %(delay_s)s)),
           clock.now + make_interval(secs => %(max_age_s)s),
           clock.now, %(schedule)s, %(period)s, %(trace_context)s, r.limit_key, %(state)s
    FROM rows r, clock
    WHERE r.key IS NULL
       OR NOT EXISTS (SELECT 1 FROM __S__.oncebox_intents i WHERE i.key = r.key)
    ON CONFLICT (key) WHERE stage <> 'cancelled' DO NOTHING
    RETURNING id, key
),
counted AS (
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT n.name, pg_backend_pid(), n.value
    FROM (SELECT 'enqueue_duplicates' AS name,
                 (SELECT count(*) FROM rows) - (SELECT count(*) FROM inserted) AS value
          UNION ALL
          SELECT 'jobs_enqueued', (SELECT count(*) FROM inserted)) AS n
    WHERE n.value > 0
    ORDER BY n.name
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id, key FROM inserted;

-- name: job_merge
-- An enqueue of a debounced or throttled task joins the pending job of its debounce key
-- (jobs/debounce.py): the ready job holding the key, which its lease clears (0015). With
-- keep_last it takes this enqueue's arguments, key, group and partition — unless that key is
-- another job's or claimed (then nothing is merged: the insert that follows finds the key taken);
-- a debounce pushes its run time to a window from now, never past max_wait after the job was
-- created. Counted as enqueue_collapsed.
-- fence: debounce_key, state
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
merged AS (
    UPDATE __S__.oncebox_jobs j
    SET args = CASE WHEN %(keep_last)s THEN %(args)s::jsonb ELSE j.args END,
        key = CASE WHEN %(keep_last)s THEN %(key)s ELSE j.key END,
        group_key = CASE WHEN %(keep_last)s THEN %(group_key)s ELSE j.group_key END,
        limit_key = CASE WHEN %(keep_last)s THEN %(limit_key)s ELSE j.limit_key END,
        run_at = CASE WHEN %(throttle)s THEN j.run_at
                      ELSE LEAST(clock.now + make_interval(secs => %(window_s)s),
                                 COALESCE(j.created_at + make_interval(secs => %(max_wait_s)s),
                                          'infinity'::timestamptz)) END
    FROM clock
    WHERE j.debounce_key = %(debounce_key)s AND j.stage = 'ready' AND j.state = 'ready'
      AND (NOT %(keep_last)s OR %(key)s::text IS NULL OR j.key = %(key)s::text
           OR (NOT EXISTS (SELECT 1 FROM __S__.oncebox_jobs o
                           WHERE o.key = %(key)s::text AND o.stage <> 'cancelled')
               AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_intents i
                               WHERE i.key = %(key)s::text)))
    RETURNING j.id, j.key
),
counted AS (
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT 'enqueue_collapsed', pg_backend_pid(), 1 WHERE EXISTS (SELECT 1 FROM merged)
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id, key FROM merged;

-- name: job_insert_collapsed
-- The pending job of a debounce key, when job_merge found none: due a window from now
-- (debounce), or at once unless the job before it ran less than a window ago (throttle: its
-- run time is kept as the row ('~throttle', debounce key) of oncebox_limits). Nothing is
-- written when the key has an intent, or a unique index holds another row: the key's job, or a
-- pending job another enqueue just made (the caller then merges into it). Counted as job_insert,
-- save that a racing enqueue's pending job makes a keyed enqueue count as a duplicate before
-- it merges (the conflicting row is newer than this statement's snapshot).
-- no fence: the throttle's time is written only with the pending job it times, which one enqueue
--   inserts (the unique debounce index)
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
inserted AS (
    INSERT INTO __S__.oncebox_jobs
        (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at,
         created_at, trace_context, limit_key, debounce_key)
    SELECT %(key)s, %(task)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(group_key)s,
           %(max_attempts)s,
           CASE WHEN %(throttle)s
                THEN GREATEST(clock.now,
                              (SELECT l.updated_at FROM __S__.oncebox_limits l
                               WHERE l.name = '~throttle' AND l.partition = %(debounce_key)s)
                              + make_interval(secs => %(window_s)s))
                ELSE clock.now + make_interval(secs => %(window_s)s) END,
           clock.now + make_interval(secs => %(max_age_s)s),
           clock.now, %(trace_context)s, %(limit_key)s, %(debounce_key)s
    FROM clock
    WHERE %(key)s::text IS NULL
       OR NOT EXISTS (SELECT 1 FROM __S__.oncebox_intents i WHERE i.key = %(key)s::text)
    ON CONFLICT DO NOTHING
    RETURNING id, state, run_at
),
throttled AS (
    INSERT INTO __S__.oncebox_limits AS l (name, partition, updated_at)
    SELECT '~throttle', %(debounce_key)s, run_at FROM inserted WHERE %(throttle)s
    ON CONFLICT (name, partition) DO UPDATE SET updated_at = excluded.updated_at
),
counted AS (
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT n.name, pg_backend_pid(), 1
    FROM (SELECT CASE WHEN EXISTS (SELECT 1 FROM inserted) THEN 'jobs_enqueued'
                      WHEN %(key)s::text IS NOT NULL THEN 'enqueue_duplicates' END AS name) n
    WHERE n.name IS NOT NULL
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id, state FROM inserted;

-- name: job_enqueue_conflict
-- Why an insert wrote nothing: the job holding the key, and/or the key's intent.
SELECT j.id AS active_job_id, j.state AS active_state, i.job_id AS intent_job_id,
       i.claimed_at AS intent_claimed_at
FROM (SELECT 1) AS one
LEFT JOIN __S__.oncebox_jobs j
       ON j.key = %(key)s AND j.stage <> 'cancelled'
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
-- Only jobs no limit holds: a limited task's are leased by job_lease_limited.
-- fence: state, run_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
picked AS (
    SELECT j.id
    FROM __S__.oncebox_jobs j
    WHERE j.stage = 'ready' AND j.state = 'ready' AND j.limit_key IS NULL
      AND j.run_at <= (SELECT now FROM clock)
      AND j.task = ANY(%(tasks)s::text[])
      AND j.queue = ANY(%(queues)s::text[])
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM __S__.oncebox_jobs g
            WHERE g.group_key = j.group_key AND g.queue = j.queue
              AND g.stage = 'ready' AND g.id <> j.id
              AND (g.state = 'leased' OR g.id < j.id)))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
leased AS (
    UPDATE __S__.oncebox_jobs j
    SET state = 'leased',
        attempt = j.attempt + 1,
        leased_by = %(worker)s,
        leased_at = clock.now,
        lease_token = %(token)s,
        lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
        debounce_key = NULL  -- no longer pending: a later enqueue starts the next one (0015)
    FROM clock
    -- the picked rows by primary key: joined to `picked` instead, the planner read a table it
    -- believed small from end to end to find them again (see job_finish)
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.key, j.task, j.args::text AS args_json, j.attempt, j.max_attempts,
              j.attempt_base, j.priority, j.run_at, j.expires_at, clock.now AS leased_at,
              j.trace_context, j.lease_expires_at
),
held AS (  -- the lease's own row (0024): what the heartbeat moves and the rescuer reads; one
           -- lease may take limited jobs and then unlimited ones under its token
    INSERT INTO __S__.oncebox_job_leases AS l (token, worker, expires_at, ids)
    SELECT %(token)s::uuid, %(worker)s, max(lease_expires_at), array_agg(id ORDER BY id)
    FROM leased
    HAVING count(*) > 0
    ON CONFLICT (token) DO UPDATE
    SET ids = l.ids || excluded.ids, expires_at = GREATEST(l.expires_at, excluded.expires_at)
)
SELECT id, key, task, args_json, attempt, max_attempts, attempt_base, priority, run_at,
       expires_at, leased_at, trace_context
FROM leased;

-- name: job_unlimit
-- Ready jobs that carry a partition though the caller's code declares their task without
-- limits (%(tasks)s): back into the claim index, a batch of %(limit)s, through
-- oncebox_jobs_limited (nothing to do costs a probe per task) — only for a task no process has
-- declared limited within %(within_s)s seconds (limit_declare): the caller may be a worker of
-- the release before the one that limits it (jobs/declarations.py). Run by the lease rescuer.
-- A declaration committed before this statement (so before any job of that release it can
-- see) stops it: the declarations are read in the statement, the rows rechecked under their lock.
-- fence: state, limit_key, declared_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
undeclared AS MATERIALIZED (
    SELECT t.task FROM unnest(%(tasks)s::text[]) AS t(task)
    WHERE NOT EXISTS (
        SELECT 1 FROM __S__.oncebox_limit_declarations d
        WHERE d.task = t.task
          AND d.declared_at > (SELECT now FROM clock) - make_interval(secs => %(within_s)s))
)
UPDATE __S__.oncebox_jobs
SET limit_key = NULL
WHERE id = ANY(ARRAY(
    SELECT id FROM __S__.oncebox_jobs
    WHERE stage = 'ready' AND state = 'ready' AND limit_key IS NOT NULL
      AND task = ANY(ARRAY(SELECT task FROM undeclared))
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED));

-- name: job_limited_partitions
-- After limit_lock, in its transaction: each partition of the given limited tasks that has a
-- ready job, found by a skip scan of oncebox_jobs_limited (one probe per partition, whatever
-- waits in it), with the partition's rows of the per-partition rate limits %(rates)s (a row per
-- bucket; none yet: NULL name, a full bucket).
WITH RECURSIVE parts(task, part) AS (
    SELECT t.task, (SELECT min(j.limit_key) FROM __S__.oncebox_jobs j
                    WHERE j.stage = 'ready' AND j.state = 'ready' AND j.limit_key IS NOT NULL
                      AND j.task = t.task)
    FROM unnest(%(tasks)s::text[]) AS t(task)
    UNION ALL
    SELECT p.task, (SELECT min(j.limit_key) FROM __S__.oncebox_jobs j
                    WHERE j.stage = 'ready' AND j.state = 'ready' AND j.limit_key IS NOT NULL
                      AND j.task = p.task
                      AND j.limit_key > p.part)
    FROM parts p
    WHERE p.part IS NOT NULL
)
SELECT p.task, p.part AS partition, b.name, b.tokens, b.updated_at
FROM parts p
LEFT JOIN __S__.oncebox_limits b
       ON b.name = ANY(%(rates)s::text[]) AND b.partition = p.part AND p.part <> ''
WHERE p.part IS NOT NULL
ORDER BY 1, 2;

-- name: job_limited_leased
-- The slots in use: the leased jobs per partition of the tasks that share a concurrency limit
-- (oncebox_jobs_slots: a leased job's `slot` is its partition, 0024).
SELECT task, slot AS partition, count(*) AS leased
FROM __S__.oncebox_jobs
WHERE slot IS NOT NULL AND task = ANY(%(counted)s::text[])
GROUP BY 1, 2;

-- name: job_limited_next_due
-- Each limited task's earliest ready job that falls due after now: when a partition with room
-- may next have work (the task's first entry of oncebox_jobs_task_due past now).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT t.task, f.run_at AS at
FROM unnest(%(tasks)s::text[]) AS t(task),
     LATERAL (SELECT j.task, j.run_at FROM __S__.oncebox_jobs j
              WHERE j.stage = 'ready' AND j.state = 'ready'
                AND (j.task, j.run_at) > (t.task, (SELECT now FROM clock))
              ORDER BY j.task, j.run_at LIMIT 1) f
WHERE f.task = t.task;

-- name: job_limited_waiting
-- What the limits hold back, for status: per partition of the given limited tasks (the first
-- %(partitions)s, by the skip scan of job_limited_partitions), its due ready jobs counted up to
-- %(cap)s in claim order, and the earliest due time among those counted (the wait of a
-- partition's oldest job, when its jobs share a priority).
WITH RECURSIVE parts(task, part) AS (
    SELECT t.task, (SELECT min(j.limit_key) FROM __S__.oncebox_jobs j
                    WHERE j.stage = 'ready' AND j.state = 'ready' AND j.limit_key IS NOT NULL
                      AND j.task = t.task)
    FROM unnest(%(tasks)s::text[]) AS t(task)
    UNION ALL
    SELECT p.task, (SELECT min(j.limit_key) FROM __S__.oncebox_jobs j
                    WHERE j.stage = 'ready' AND j.state = 'ready' AND j.limit_key IS NOT NULL
                      AND j.task = p.task
                      AND j.limit_key > p.part)
    FROM parts p
    WHERE p.part IS NOT NULL
),
clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
listed AS (SELECT task, part FROM parts WHERE part IS NOT NULL LIMIT %(partitions)s)
SELECT l.task, l.part AS partition, count(w.run_at) AS waiting, min(w.run_at) AS oldest
FROM listed l
LEFT JOIN LATERAL (
    SELECT j.run_at FROM __S__.oncebox_jobs j
    WHERE j.stage = 'ready' AND j.state = 'ready' AND j.task = l.task AND j.limit_key = l.part
      AND j.run_at <= (SELECT now FROM clock)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(cap)s
) w ON true
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: job_limited_candidates
-- Up to n due jobs from each asked partition, in claim order (%(asks)s: [task, partition, n]).
-- Not locked: only a lease holding the limit's lock takes a limited job.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT a.task, a.part AS partition, c.id, c.priority, c.run_at
FROM (SELECT x ->> 0 AS task, x ->> 1 AS part, (x ->> 2)::int AS n
      FROM jsonb_array_elements(%(asks)s::jsonb) AS x) a
CROSS JOIN LATERAL (
    SELECT j.id, j.priority, j.run_at
    FROM __S__.oncebox_jobs j
    WHERE j.stage = 'ready' AND j.state = 'ready' AND j.task = a.task AND j.limit_key = a.part
      AND j.run_at <= (SELECT now FROM clock)
      AND j.queue = ANY(%(queues)s::text[])
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM __S__.oncebox_jobs g
            WHERE g.group_key = j.group_key AND g.queue = j.queue
              AND g.stage = 'ready' AND g.id <> j.id
              AND (g.state = 'leased' OR g.id < j.id)))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT a.n
) c;

-- name: job_lease_limited
-- Lease the chosen limited jobs (limits/allocation.py) as job_lease leases its own. The choice
-- was read one round trip before, unlocked: a job changed since is passed over, not waited for
-- (SKIP LOCKED: an enqueue's open transaction may be merging into it) nor taken as it is now —
-- still ready, due, in the partition it was counted in (%(picks)s: [id, partition]), and the
-- head of its ordered group.
-- fence: state, limit_key, run_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
picks AS MATERIALIZED (
    SELECT (p ->> 0)::bigint AS id, p ->> 1 AS part
    FROM jsonb_array_elements(%(picks)s::jsonb) AS p
),
picked AS (
    SELECT j.id
    FROM __S__.oncebox_jobs j
    JOIN picks p ON p.id = j.id
    WHERE j.id = ANY(ARRAY(SELECT id FROM picks))
      AND j.state = 'ready' AND j.limit_key = p.part
      AND j.run_at <= (SELECT now FROM clock)
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM __S__.oncebox_jobs g
            WHERE g.group_key = j.group_key AND g.queue = j.queue
              AND g.stage = 'ready' AND g.id <> j.id
              AND (g.state = 'leased' OR g.id < j.id)))
    FOR UPDATE OF j SKIP LOCKED
),
leased AS (
    UPDATE __S__.oncebox_jobs j
    SET state = 'leased',
        attempt = j.attempt + 1,
        leased_by = %(worker)s,
        leased_at = clock.now,
        lease_token = %(token)s,
        lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
        debounce_key = NULL
    FROM clock
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING j.id, j.key, j.task, j.args::text AS args_json, j.attempt, j.max_attempts,
              j.attempt_base, j.priority, j.run_at, j.expires_at, clock.now AS leased_at,
              j.trace_context, j.lease_expires_at
),
held AS (  -- the lease's own row (0024): what the heartbeat moves and the rescuer reads; one
           -- lease may take limited jobs and then unlimited ones under its token
    INSERT INTO __S__.oncebox_job_leases AS l (token, worker, expires_at, ids)
    SELECT %(token)s::uuid, %(worker)s, max(lease_expires_at), array_agg(id ORDER BY id)
    FROM leased
    HAVING count(*) > 0
    ON CONFLICT (token) DO UPDATE
    SET ids = l.ids || excluded.ids, expires_at = GREATEST(l.expires_at, excluded.expires_at)
)
SELECT id, key, task, args_json, attempt, max_attempts, attempt_base, priority, run_at,
       expires_at, leased_at, trace_context
FROM leased;

-- name: job_lease_extend
-- Heartbeat: push the deadline of live leases out (never earlier), on each lease's own row (0024)
-- and on its jobs; never revives an ended lease (a rescued job no longer holds the token).
-- A job row locked right now is skipped: its consumer transaction is settling it. Waiting for it
-- while holding the rows this statement already updated would deadlock with that settlement,
-- which takes its rows in its own order; skipped, a row keeps a deadline at least two thirds of
-- a lease away, and the next beat extends it if the settlement rolled back.
-- fence: state, lease_token
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
extended AS (
    UPDATE __S__.oncebox_job_leases l
    SET expires_at = GREATEST(l.expires_at,
                              (SELECT now FROM clock) + make_interval(secs => %(lease_s)s))
    WHERE l.token = ANY(%(tokens)s::uuid[])
    RETURNING l.token, l.ids, l.expires_at
)
UPDATE __S__.oncebox_jobs j
SET lease_expires_at = GREATEST(j.lease_expires_at, e.expires_at)
FROM extended e
WHERE j.id IN (SELECT x.id FROM __S__.oncebox_jobs x
               WHERE x.id = ANY(ARRAY(SELECT unnest(ids) FROM extended))
                 AND x.state = 'leased' AND x.lease_token = ANY(%(tokens)s::uuid[])
               FOR UPDATE SKIP LOCKED)
  AND j.lease_token = e.token;

-- name: job_release
-- Give leased jobs back without spending an attempt (shutdown, a lock timeout on the claim, a
-- batch a store outage cut short), due after %(delay_s)s. %(jobs)s: [id, the attempt its lease
-- took] per job. A lease that ran out and was rescued, or taken since, is not touched. The
-- lease's own row goes with its last held job (see job_finish).
-- fence: lease_token, attempt
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
given AS MATERIALIZED (
    SELECT (g ->> 0)::bigint AS id, (g ->> 1)::int AS attempt
    FROM jsonb_array_elements(%(jobs)s::jsonb) AS g
),
released AS (
    UPDATE __S__.oncebox_jobs j
    SET state = 'ready',
        attempt = j.attempt - 1,
        run_at = clock.now + make_interval(secs => %(delay_s)s),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM given g, clock
    WHERE j.id = ANY(ARRAY(SELECT id FROM given)) AND j.id = g.id  -- by primary key: see job_finish
      AND j.lease_token = %(token)s AND j.attempt = g.attempt AND j.state = 'leased'
    RETURNING j.id
),
closed AS (  -- see job_finish
    DELETE FROM __S__.oncebox_job_leases l
    WHERE l.token = %(token)s::uuid
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_jobs h
                      WHERE h.id = ANY(l.ids) AND h.lease_token = l.token
                        AND h.id <> ALL(ARRAY(SELECT id FROM released)))
)
SELECT id FROM released;

-- name: job_rescue_expired
-- Leases past their deadline, found by their own rows (0024), up to %(limit)s jobs: the attempt
-- is recorded as lease_expired, and the job becomes ready again, or dead when its attempts or
-- max age are spent. A lease's row goes once none of its jobs holds its token; one whose job a
-- transaction holds right now (settling it) stays for the next pass.
-- fence: state, lease_token, lease_expires_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
ran_out AS MATERIALIZED (
    SELECT l.token, l.ids FROM __S__.oncebox_job_leases l
    WHERE l.expires_at < (SELECT now FROM clock)
    ORDER BY l.expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
expired AS (
    SELECT j.id FROM __S__.oncebox_jobs j
    WHERE j.id = ANY(ARRAY(SELECT unnest(ids) FROM ran_out))
      AND j.state = 'leased' AND j.lease_expires_at < (SELECT now FROM clock)
      AND j.lease_token = ANY(ARRAY(SELECT token FROM ran_out))
    ORDER BY j.lease_expires_at
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
closed AS (
    DELETE FROM __S__.oncebox_job_leases l
    USING ran_out r
    WHERE l.token = r.token
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_jobs h
                      WHERE h.id = ANY(r.ids) AND h.lease_token = r.token
                        AND h.id <> ALL(ARRAY(SELECT id FROM rescued)))
),
recorded AS (
    INSERT INTO __S__.oncebox_job_attempts
        (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempt, leased_by, leased_at, now, 'lease_expired', last_error FROM rescued
    ON CONFLICT (job_id, attempt) DO NOTHING
),
counted AS (  -- counters.sql
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT n.name, pg_backend_pid(), n.value
    FROM (SELECT 'jobs_dead' AS name, count(*) FILTER (WHERE state = 'dead') AS value
          FROM rescued
          UNION ALL
          SELECT 'leases_expired', count(*) FROM rescued) AS n
    WHERE n.value > 0
    ORDER BY n.name
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id, key, task, state, attempt, leased_by AS worker FROM rescued;

-- name: job_finish
-- Settle leased jobs of one lease, fenced on its token: done (completed | duplicate) — moved to
-- the history in this statement (0025) —, ready again after a delay (failed attempt), or dead.
-- Failed attempts are recorded. Returns the ids settled; a job whose lease was superseded is not
-- among them.
-- fence: lease_token
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
input AS MATERIALIZED (  -- %(finishes)s: [id, state, outcome, delay in s, error] per job
    SELECT (f ->> 0)::bigint AS id, f ->> 1 AS state, f ->> 2 AS outcome,
           (f ->> 3)::float8 AS delay_s, f ->> 4 AS error
    FROM jsonb_array_elements(%(finishes)s::jsonb) AS f
),
moved AS (  -- done: out of the jobs table (see kept for how the rows are found)
    DELETE FROM __S__.oncebox_jobs j
    USING input i
    WHERE j.id = ANY(ARRAY(SELECT id FROM input WHERE state = 'done'))
      AND j.id = i.id AND j.lease_token = %(token)s
    RETURNING j.*, i.outcome AS settled_outcome, i.error AS settled_error
),
archived AS (
    INSERT INTO __S__.oncebox_job_history
        (id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
         attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
         last_error, schedule, period, trace_context, limit_key)
    SELECT m.id, m.key, m.task, m.queue, m.args, 'done', m.settled_outcome, m.priority,
           m.group_key, m.attempt, m.max_attempts, m.attempt_base, m.run_at, m.expires_at,
           m.created_at, m.leased_by, m.leased_at, clock.now,
           COALESCE(m.settled_error, m.last_error), m.schedule, m.period, m.trace_context,
           m.limit_key
    FROM moved m, clock
),
kept AS (
    UPDATE __S__.oncebox_jobs j
    SET state = i.state,
        outcome = i.outcome,
        run_at = CASE WHEN i.state = 'ready'
                      THEN clock.now + make_interval(secs => i.delay_s) ELSE j.run_at END,
        finished_at = CASE WHEN i.state = 'dead' THEN clock.now END,
        last_error = COALESCE(i.error, j.last_error),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM input i, clock
    -- The rows are looked up by primary key, whatever the statistics: `id = ANY(ARRAY(...))` is
    -- an index condition, where `j.id = i.id` alone let the planner read a table it believed
    -- small from end to end, matching each row against each element (tests/
    -- test_postgres_plans.py). The input is MATERIALIZED so each id is read from the JSON once.
    -- No `state = 'leased'`: the token implies it (a CHECK constraint).
    WHERE j.id = ANY(ARRAY(SELECT id FROM input WHERE state <> 'done'))
      AND j.id = i.id AND j.lease_token = %(token)s
    RETURNING j.id, j.attempt, j.leased_by, j.leased_at, j.state, i.outcome, i.error
),
settled AS (
    SELECT id, attempt, leased_by, leased_at, 'done' AS state, settled_outcome AS outcome,
           settled_error AS error, clock.now
    FROM moved, clock
    UNION ALL
    SELECT id, attempt, leased_by, leased_at, state, outcome, error, clock.now FROM kept, clock
),
closed AS (
    -- The lease's own row (0024) goes with its last held job: a probe by primary key per job
    -- of the lease. Two transactions settling halves of one lease at once each see the other's
    -- half held, and leave the row to the rescuer, which deletes it once its deadline passes.
    DELETE FROM __S__.oncebox_job_leases l
    WHERE l.token = %(token)s::uuid
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_jobs h
                      WHERE h.id = ANY(l.ids) AND h.lease_token = l.token
                        AND h.id <> ALL(ARRAY(SELECT id FROM settled)))
),
recorded AS (
    INSERT INTO __S__.oncebox_job_attempts
        (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempt, leased_by, leased_at, now,
           CASE WHEN state = 'dead' THEN 'dead' ELSE 'failed' END, error
    FROM settled WHERE state <> 'done'
    ON CONFLICT (job_id, attempt) DO NOTHING
),
counted AS (  -- what settled, by what it became (counters.sql)
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT CASE WHEN state = 'done' AND outcome = 'duplicate' THEN 'claim_conflicts'
                WHEN state = 'done' THEN 'jobs_completed'
                WHEN state = 'ready' THEN 'jobs_retried'
                ELSE 'jobs_dead' END AS name,
           pg_backend_pid(), count(*)
    FROM settled
    GROUP BY 1
    ORDER BY 1
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id FROM settled;

-- name: job_relay_check
-- The rows of jobs a broker delivered (0016), read before they run: a delivery is current when
-- its job is still relayed at the attempt before the one the message carries; anything else is
-- a copy that lost its race (a lost acknowledgement, a duplicate publish, a cancel).
-- A job not in the jobs table is looked for in the history (0025): done or cancelled since.
WITH hot AS MATERIALIZED (
    SELECT id, state, attempt, attempt_base, max_attempts, key, expires_at, trace_context
    FROM __S__.oncebox_jobs WHERE id = ANY(%(ids)s::bigint[])
)
SELECT * FROM hot
UNION ALL
SELECT id, state, attempt, attempt_base, max_attempts, key, expires_at, trace_context
FROM __S__.oncebox_job_history
WHERE id = ANY(ARRAY(SELECT unnest(%(ids)s::bigint[]) EXCEPT SELECT id FROM hot));

-- name: job_settle_relayed
-- Settle jobs a broker delivered, fenced on their attempt: each row moves only while it is
-- still relayed at the attempt before the delivered one, so of two copies of one message only
-- the first to commit settles it. Done (completed | duplicate: moved to the history, 0025),
-- relayed again after a delay (a failed attempt: the trigger writes the next attempt's publish,
-- due then), or dead. Failed attempts are recorded and outcomes counted, as job_finish does.
-- fence: state, attempt
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
input AS MATERIALIZED (  -- %(finishes)s: [id, run, state, outcome, delay in s, error, worker,
                         -- started at] per job
    SELECT (f ->> 0)::bigint AS id, (f ->> 1)::int AS run, f ->> 2 AS state, f ->> 3 AS outcome,
           (f ->> 4)::float8 AS delay_s, f ->> 5 AS error, f ->> 6 AS worker,
           (f ->> 7)::timestamptz AS started_at
    FROM jsonb_array_elements(%(finishes)s::jsonb) AS f
),
moved AS (
    DELETE FROM __S__.oncebox_jobs j
    USING input i
    WHERE j.id = ANY(ARRAY(SELECT id FROM input WHERE state = 'done')) AND j.id = i.id
      AND j.state = 'relayed' AND j.attempt = i.run - 1
    RETURNING j.*, i.run, i.outcome AS settled_outcome, i.error AS settled_error,
              i.worker AS settled_by, i.started_at
),
archived AS (
    INSERT INTO __S__.oncebox_job_history
        (id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
         attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
         last_error, schedule, period, trace_context, limit_key)
    SELECT m.id, m.key, m.task, m.queue, m.args, 'done', m.settled_outcome, m.priority,
           m.group_key, m.run, m.max_attempts, m.attempt_base, m.run_at, m.expires_at,
           m.created_at, m.settled_by, m.started_at, clock.now,
           COALESCE(m.settled_error, m.last_error), m.schedule, m.period, m.trace_context,
           m.limit_key
    FROM moved m, clock
),
kept AS (
    UPDATE __S__.oncebox_jobs j
    SET state = CASE WHEN i.state = 'ready' THEN 'relayed' ELSE i.state END,
        outcome = i.outcome,
        attempt = i.run,
        run_at = CASE WHEN i.state = 'ready'
                      THEN clock.now + make_interval(secs => i.delay_s) ELSE j.run_at END,
        finished_at = CASE WHEN i.state = 'dead' THEN clock.now END,
        last_error = COALESCE(i.error, j.last_error),
        leased_by = i.worker,
        leased_at = i.started_at
    FROM input i, clock
    WHERE j.id = ANY(ARRAY(SELECT id FROM input WHERE state <> 'done'))
      AND j.id = i.id  -- see job_finish
      AND j.state = 'relayed' AND j.attempt = i.run - 1
    RETURNING j.id, j.attempt, j.leased_by, j.leased_at, i.state, i.outcome, i.error
),
settled AS (
    SELECT id, run AS attempt, settled_by AS leased_by, started_at AS leased_at, 'done' AS state,
           settled_outcome AS outcome, settled_error AS error, clock.now
    FROM moved, clock
    UNION ALL
    SELECT id, attempt, leased_by, leased_at, state, outcome, error, clock.now FROM kept, clock
),
recorded AS (
    INSERT INTO __S__.oncebox_job_attempts
        (job_id, attempt, worker, started_at, finished_at, outcome, error)
    SELECT id, attempt, leased_by, leased_at, now,
           CASE WHEN state = 'dead' THEN 'dead' ELSE 'failed' END, error
    FROM settled WHERE state <> 'done'
    ON CONFLICT (job_id, attempt) DO NOTHING
),
counted AS (  -- as job_finish counts
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT CASE WHEN state = 'done' AND outcome = 'duplicate' THEN 'claim_conflicts'
                WHEN state = 'done' THEN 'jobs_completed'
                WHEN state = 'ready' THEN 'jobs_retried'
                ELSE 'jobs_dead' END AS name,
           pg_backend_pid(), count(*)
    FROM settled
    GROUP BY 1
    ORDER BY 1
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
)
SELECT id FROM settled;

-- name: job_relay_adopt
-- Ready jobs of queues a broker holds become relayed (the trigger writes their publish), up to
-- %(limit)s: a dead letter replayed, a job enqueued by a process that did not know the queue's
-- broker, a queue moved onto a broker with work waiting. Read through the task due index, by
-- task, as job_next_due does; rows another transaction holds are left for the next pass.
-- fence: state
UPDATE __S__.oncebox_jobs j
SET state = 'relayed'
WHERE j.id IN (
    SELECT r.id
    FROM unnest(%(tasks)s::text[]) AS t(task),
         LATERAL (SELECT x.id FROM __S__.oncebox_jobs x
                  WHERE x.stage = 'ready' AND x.state = 'ready' AND x.task = t.task
                    AND x.queue = ANY(%(queues)s::text[])
                  ORDER BY x.task, x.run_at LIMIT %(limit)s
                  FOR UPDATE SKIP LOCKED) r
    LIMIT %(limit)s
);

-- name: job_attempt_note
-- Record, outside the refused transaction, that a superseded worker tried to commit.
-- no fence: appends a note to an attempt already recorded, which nothing else changes
INSERT INTO __S__.oncebox_job_attempts AS a
    (job_id, attempt, worker, started_at, finished_at, outcome, error, note)
VALUES (%(job_id)s, %(attempt)s, %(worker)s, NULL, (SELECT __S__.oncebox_now()), 'superseded',
        NULL, %(note)s)
ON CONFLICT (job_id, attempt) DO UPDATE
SET note = COALESCE(a.note || '; ', '') || excluded.note;

-- name: job_replay
-- Dead → ready in place: same id, same key; the retry budget restarts; audited in the same
-- statement (so in the same transaction). With `if_attempt`, only while the job's attempt count
-- is still the one an operator confirmed (a batch of a dry run's rows: a job replayed by someone
-- else and dead again since is not the row that was confirmed).
-- fence: state, if_attempt
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
replayed AS (
    UPDATE __S__.oncebox_jobs j
    SET state = 'ready', run_at = clock.now, attempt_base = j.attempt, finished_at = NULL
    FROM clock
    WHERE j.id = %(id)s AND j.state = 'dead'
      AND (%(if_attempt)s::int IS NULL OR j.attempt = %(if_attempt)s::int)
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
SELECT r.id AS job_id, r.key, a.id AS audit_id FROM replayed r, audited a;

-- name: job_cancel
-- Ready (or relayed: its broker's message is then acknowledged unrun) → cancelled (a durable
-- timer withdrawn), moved to the history (0025), audited in the same statement.
-- fence: state
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
cancelled AS (
    DELETE FROM __S__.oncebox_jobs j
    WHERE j.id = %(id)s AND j.state IN ('ready', 'relayed')
    RETURNING j.*
),
archived AS (
    INSERT INTO __S__.oncebox_job_history
        (id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
         attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
         last_error, schedule, period, trace_context, limit_key)
    SELECT c.id, c.key, c.task, c.queue, c.args, 'cancelled', NULL, c.priority, c.group_key,
           c.attempt, c.max_attempts, c.attempt_base, c.run_at, c.expires_at, c.created_at,
           c.leased_by, c.leased_at, clock.now, c.last_error, c.schedule, c.period,
           c.trace_context, c.limit_key
    FROM cancelled c, clock
),
audited AS (
    INSERT INTO __S__.oncebox_audit
        (at, actor, action, target_kind, target_id, target_key, reason, details)
    SELECT clock.now, %(actor)s, 'cancel', 'job', c.id, c.key, %(reason)s,
           jsonb_build_object('task', c.task)
    FROM cancelled c, clock
    RETURNING id
)
SELECT c.id AS job_id, c.key, a.id AS audit_id FROM cancelled c, audited a;

-- name: job_discard
-- Dead → cancelled (an operator abandons the operation), moved to the history (0025): its
-- attempts and last error stay, and its key is free for a new enqueue (a dead job holds no
-- intent). `if_attempt` as in job_replay. Audited as 'discard' in the same statement.
-- fence: state, if_attempt
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
discarded AS (
    DELETE FROM __S__.oncebox_jobs j
    WHERE j.id = %(id)s AND j.state = 'dead'
      AND (%(if_attempt)s::int IS NULL OR j.attempt = %(if_attempt)s::int)
    RETURNING j.*
),
archived AS (
    INSERT INTO __S__.oncebox_job_history
        (id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
         attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
         last_error, schedule, period, trace_context, limit_key)
    SELECT d.id, d.key, d.task, d.queue, d.args, 'cancelled', NULL, d.priority, d.group_key,
           d.attempt, d.max_attempts, d.attempt_base, d.run_at, d.expires_at, d.created_at,
           d.leased_by, d.leased_at, clock.now, d.last_error, d.schedule, d.period,
           d.trace_context, d.limit_key
    FROM discarded d, clock
),
audited AS (
    INSERT INTO __S__.oncebox_audit
        (at, actor, action, target_kind, target_id, target_key, reason, details)
    SELECT clock.now, %(actor)s, 'discard', 'job', d.id, d.key, %(reason)s,
           jsonb_build_object('task', d.task, 'attempts', d.attempt)
    FROM discarded d, clock
    RETURNING id
)
SELECT d.id AS job_id, d.key, a.id AS audit_id FROM discarded d, audited a;

-- name: job_get
-- Wherever the job is: the jobs table or the history (0025).
SELECT id, key, task, queue, args::text AS args_json, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM __S__.oncebox_all_jobs WHERE id = %(id)s;

-- name: job_find_by_key
-- The jobs holding this key (any state but cancelled: the one waiting, running or dead, and those
-- done), and the job that claimed its intent.
SELECT id, key, task, queue, args::text AS args_json, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM __S__.oncebox_all_jobs
WHERE (key = %(key)s AND stage <> 'cancelled')
   OR id = (SELECT job_id FROM __S__.oncebox_intents WHERE key = %(key)s)
ORDER BY id;

-- name: job_attempt_list
SELECT job_id, attempt, worker, started_at, finished_at, outcome, error, note
FROM __S__.oncebox_job_attempts WHERE job_id = %(id)s ORDER BY attempt;

-- name: job_count_by_state
-- From the depths the triggers keep (0010), not a count over the table.
SELECT state, outcome, sum(value)::bigint AS count
FROM __S__.oncebox_depths WHERE kind = 'job'
GROUP BY 1, 2 HAVING sum(value) <> 0;

-- name: job_next_due
-- When the earliest ready job of these tasks and queues falls due (NULL if none), and the time now:
-- the earliest of each task's first entry in oncebox_jobs_task_due, never a min() over every
-- ready job (0.6 s at a 1 000 000-job backlog, with stale statistics). Each is the first ready
-- job from this task on, in (task, run_at) order, kept when it is this task's: a "task = t.task
-- ORDER BY run_at" would let the planner walk the due index (run_at) past every other task's job.
SELECT (SELECT min(f.run_at)
        FROM unnest(%(tasks)s::text[]) AS t(task),
             LATERAL (SELECT j.task, j.run_at FROM __S__.oncebox_jobs j
                      WHERE j.stage = 'ready' AND j.state = 'ready' AND j.task >= t.task
                        AND j.queue = ANY(%(queues)s::text[])
                      ORDER BY j.task, j.run_at LIMIT 1) f
        WHERE f.task = t.task) AS at,
       (SELECT __S__.oncebox_now()) AS now;

-- name: job_prune
-- Delete a batch of one task's done and cancelled jobs finished before the cutoff, oldest first,
-- from the history (oncebox_job_history_finished, 0025), with their attempts. The pruner asks
-- for a cutoff on a Monday (retention/policy.py, `by_week`): a week all of whose tasks' jobs
-- may go is dropped whole by job_history_drop, and a batch takes the rest (a week that a task
-- keeps longer, or a job with a message still to send, holds). A job with a message not yet sent (nor discarded) stays: its period's
-- figures still move with it, and an operator may still act on it. What a done job of a
-- schedule period counted is added to its run's summary (0011) in the same statement: the
-- period's figures outlive its jobs. Counted as pruned_jobs.
-- fence: state, finished_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT j.id, j.schedule, j.period, j.state, j.finished_at
    FROM __S__.oncebox_job_history j
    WHERE j.task = %(task)s
      AND j.finished_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
      -- OFFSET 0 keeps this a probe of oncebox_outbox_job per job: as an anti-join the planner,
      -- expecting almost no unsent message, read the whole outbox for every batch (bench/
      -- retention.py: 215 ms a batch at 500 000 messages, 3 ms with the probe)
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox o
                      WHERE o.job_id = j.id AND o.state <> 'sent' AND o.discarded_at IS NULL
                      OFFSET 0)
    ORDER BY j.finished_at, j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
span AS MATERIALIZED (SELECT min(finished_at) AS first, max(finished_at) AS last FROM doomed),
pruned_count AS (
    INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
    SELECT 'pruned_jobs', pg_backend_pid(), count(*) FROM doomed HAVING count(*) > 0
    ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
),
counted AS (  -- per period: as schedule_period_stats counts a covered job
    SELECT d.schedule, d.period, count(*) AS done, COALESCE(sum(m.sent), 0) AS sent,
           count(*) FILTER (
               WHERE COALESCE(m.last_sent_at, d.finished_at)
                     <= run.fire_at + make_interval(secs => w.window_s)) AS on_time,
           w.window_s
    FROM doomed d
    JOIN __S__.oncebox_schedule_runs run
        ON run.schedule = d.schedule AND run.period = d.period
    LEFT JOIN __S__.oncebox_schedules sch ON sch.name = d.schedule
    CROSS JOIN LATERAL (SELECT COALESCE(run.pruned_window_s, sch.slo_window_s) AS window_s) w
    LEFT JOIN LATERAL (
        SELECT count(*) AS sent, max(o.sent_at) AS last_sent_at
        FROM __S__.oncebox_outbox o
        WHERE o.job_id = d.id AND o.discarded_at IS NULL
    ) m ON true
    WHERE d.state = 'done'
    GROUP BY d.schedule, d.period, w.window_s
),
summarised AS (
    UPDATE __S__.oncebox_schedule_runs r
    SET pruned_done = r.pruned_done + c.done,
        pruned_sent = r.pruned_sent + c.sent,
        pruned_on_time = r.pruned_on_time + c.on_time,
        pruned_window_s = c.window_s
    FROM counted c
    WHERE r.schedule = c.schedule AND r.period = c.period
),
attempts AS (  -- by key, whatever the statistics (the `= ANY(ARRAY(...))` of job_finish)
    DELETE FROM __S__.oncebox_job_attempts a
    WHERE a.job_id = ANY(ARRAY(SELECT id FROM doomed))
)
-- by id within the weeks the batch spans (a batch is oldest first: one week or two), so only
-- those weeks' partitions are probed
DELETE FROM __S__.oncebox_job_history j USING doomed d
WHERE j.id = ANY(ARRAY(SELECT id FROM doomed)) AND j.id = d.id
  AND j.finished_at >= (SELECT first FROM span) AND j.finished_at <= (SELECT last FROM span)
RETURNING j.id;

-- name: job_history_weeks
-- Make the history's weekly partitions (0025) that do not exist yet, from the week of
-- %(from_at)s (or now) to %(ahead_s)s seconds ahead; the number made. The function gives up
-- after a 2 s lock wait rather than queue every reader of the history behind it.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT __S__.oncebox_job_history_weeks(
           LEAST(clock.now, COALESCE(%(from_at)s::timestamptz, clock.now)),
           clock.now + make_interval(secs => %(ahead_s)s)) AS made
FROM clock;

-- name: job_history_move
-- A deployment's finished jobs from before the history (0025) move into it, a batch of
-- %(limit)s at a time, oldest first; the ids moved. Each batch is its own transaction: the move
-- can stop and resume anywhere, and every read sees each job once meanwhile.
-- fence: stage
WITH doomed AS (
    SELECT id FROM __S__.oncebox_jobs
    WHERE stage IN ('done', 'cancelled')
    ORDER BY task, finished_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM __S__.oncebox_jobs j
    WHERE j.id = ANY(ARRAY(SELECT id FROM doomed)) AND j.stage IN ('done', 'cancelled')
    RETURNING j.*
)
INSERT INTO __S__.oncebox_job_history
    (id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
     attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
     last_error, schedule, period, trace_context, limit_key)
SELECT id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
       attempt_base, run_at, expires_at, created_at, leased_by, leased_at, finished_at,
       last_error, schedule, period, trace_context, limit_key
FROM moved
RETURNING id;

-- name: job_history_waiting
-- Finished jobs still in the jobs table, to move into the history (counted up to %(limit)s),
-- and the earliest week job_history_weeks is asked to make: the first of them to finish, or of
-- the rows in the default partition (their week was late).
SELECT (SELECT count(*) FROM (SELECT 1 FROM __S__.oncebox_jobs
                              WHERE stage IN ('done', 'cancelled') LIMIT %(limit)s) w) AS waiting,
       LEAST((SELECT min(finished_at) FROM __S__.oncebox_jobs
              WHERE stage IN ('done', 'cancelled')),
             (SELECT min(finished_at) FROM __S__.oncebox_job_history_default))
           AS first_finished_at;

-- name: job_history_drop
-- The oldest week of the history, dropped whole once all of it is past retention (0025,
-- oncebox_job_history_drop): %(keep)s maps a task to the seconds its jobs are kept (null: for
-- ever); a task not in it keeps %(default_s)s (NULL: for ever). The week and its jobs, or no
-- row.
-- fence: locked by oncebox_job_history_drop (the week, against writers)
SELECT week, jobs FROM __S__.oncebox_job_history_drop(%(keep)s::jsonb, %(default_s)s::float8);

-- name: job_prunable
-- What retention holds of one task's finished jobs: when the oldest kept one finished, and how
-- many job_prune would delete now (counted up to %(limit)s; none when %(older_than_s)s is NULL,
-- kept for ever).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT (SELECT min(finished_at) FROM __S__.oncebox_job_history WHERE task = %(task)s) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_job_history j
            WHERE %(older_than_s)s::float8 IS NOT NULL
              AND j.task = %(task)s
              AND j.finished_at < (SELECT now FROM clock)
                                  - make_interval(secs => %(older_than_s)s::float8)
              AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox o  -- a probe: see job_prune
                              WHERE o.job_id = j.id AND o.state <> 'sent'
                                AND o.discarded_at IS NULL OFFSET 0)
            LIMIT %(limit)s) w) AS waiting;

-- name: job_list
-- Newest first, paged by id, from the jobs table and the history (0025; dead jobs through
-- oncebox_jobs_dead). `error`: a case-insensitive
-- substring of the last error; `older_than_s` / `newer_than_s`: finished (a dead job: died) at
-- least / less than that long ago; `key_prefix`: keys that start with it (the range up to
-- `key_upper`, read through the one-per-key index, so a cancelled job is not among them).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT id, key, task, queue, args::text AS args_json, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM __S__.oncebox_all_jobs
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  -- the same filter in `stage`, so a state's own index serves it (the dead rows': 0024)
  AND (%(state)s::text IS NULL OR %(state)s::text = 'leased' OR stage = %(state)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(schedule)s::text IS NULL OR schedule = %(schedule)s::text)
  AND (%(period)s::text IS NULL OR period = %(period)s::text)
  AND (%(error)s::text IS NULL OR strpos(lower(last_error), lower(%(error)s::text)) > 0)
  AND (%(older_than_s)s::float8 IS NULL
       OR finished_at <= (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s::float8))
  AND (%(newer_than_s)s::float8 IS NULL
       OR finished_at > (SELECT now FROM clock) - make_interval(secs => %(newer_than_s)s::float8))
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
  AND (%(key_prefix)s::text IS NULL  -- a key range, through oncebox_jobs_one_per_key
       OR (key >= %(key_prefix)s::text AND key < %(key_upper)s::text AND stage <> 'cancelled'))
ORDER BY id DESC
LIMIT %(limit)s;
