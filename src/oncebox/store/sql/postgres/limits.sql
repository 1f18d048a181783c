-- Rate buckets and channel pauses; the limits of tasks.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: rate_bucket_configure
-- Create missing buckets full; follow configuration changes of capacity and refill rate.
-- no fence: follows the declaring code; tokens are only ever lowered to the capacity
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
       (SELECT __S__.oncebox_now()) AS now,
       (SELECT paused_until FROM __S__.oncebox_channel_pauses WHERE channel = %(channel)s)
           AS paused_until
FROM __S__.oncebox_rate_buckets b
WHERE b.channel = %(channel)s AND b.name = ANY(%(names)s::text[])
ORDER BY b.name
FOR UPDATE OF b;

-- name: rate_bucket_update
-- fence: locked by rate_bucket_select
UPDATE __S__.oncebox_rate_buckets b
SET tokens = u.tokens, updated_at = u.updated_at
FROM unnest(%(names)s::text[], %(tokens)s::float8[], %(updated)s::timestamptz[])
    AS u(name, tokens, updated_at)
WHERE b.channel = %(channel)s AND b.name = u.name;

-- name: channel_pause_read
SELECT (SELECT __S__.oncebox_now()) AS now,
       (SELECT paused_until FROM __S__.oncebox_channel_pauses WHERE channel = %(channel)s)
           AS paused_until;

-- name: channel_pause
-- Pause a channel for everyone until now + pause_s; a longer pause already in place stays.
-- no fence: a pause only ever lengthens (the later end wins), whoever writes first
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_channel_pauses AS p (channel, paused_until, reason)
SELECT %(channel)s, clock.now + make_interval(secs => %(pause_s)s), %(reason)s FROM clock
ON CONFLICT (channel) DO UPDATE
SET paused_until = GREATEST(p.paused_until, excluded.paused_until),
    reason = CASE WHEN excluded.paused_until > p.paused_until THEN excluded.reason
                  ELSE p.reason END
RETURNING paused_until;

-- name: limit_lock
-- Take the lock of each named limit (its row for the whole limit, made if missing), in name
-- order, until the lease's transaction ends: leases of one limit run one after the other
-- (limits/allocation.py). Returns each row's bucket and the time now.
-- no fence: takes the limit's lock; its update changes nothing
INSERT INTO __S__.oncebox_limits AS l (name, partition)
SELECT n, '' FROM unnest(%(names)s::text[]) AS n ORDER BY n
ON CONFLICT (name, partition) DO UPDATE SET name = l.name
RETURNING l.name, l.tokens, l.updated_at, (SELECT __S__.oncebox_now()) AS now;

-- name: limit_spend
-- The buckets a lease took tokens from (%(spends)s: [name, partition, level before, at, [job
-- ids]]), after job_lease_limited in its transaction: each bucket is charged a token for each
-- of its jobs this lease's token now holds — what was leased, not what was chosen (a chosen
-- row another transaction had locked was skipped, and costs nothing).
-- The levels were read under the limit's lock, held until this transaction ends.
-- fence: state, lease_token, locked by limit_lock
WITH spent AS (
    SELECT s ->> 0 AS name, s ->> 1 AS part, (s ->> 2)::float8 AS level,
           (s ->> 3)::timestamptz AS at,
           (SELECT count(*) FROM __S__.oncebox_jobs j
            WHERE j.id = ANY(ARRAY(SELECT x::bigint FROM jsonb_array_elements_text(s -> 4) x))
              AND j.state = 'leased' AND j.lease_token = %(token)s) AS leased
    FROM jsonb_array_elements(%(spends)s::jsonb) AS s
)
INSERT INTO __S__.oncebox_limits AS l (name, partition, tokens, updated_at)
SELECT name, part, level - leased, at FROM spent
WHERE leased > 0
ORDER BY 1, 2
ON CONFLICT (name, partition) DO UPDATE
SET tokens = excluded.tokens, updated_at = excluded.updated_at;

-- name: limit_declare
-- This code's limits of each task (%(declared)s: [task, limits as JSON text]), declared now: a
-- worker's beat, or a process about to enqueue the task's jobs (jobs/declarations.py).
-- no fence: a declaration is what the declaring process's code says, decided from no read;
-- declared_at only moves forward (GREATEST), and only a process that limits the task writes
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_limit_declarations AS d (task, limits, declared_at)
SELECT x ->> 0, (x ->> 1)::jsonb, clock.now
FROM jsonb_array_elements(%(declared)s::jsonb) AS x, clock
ORDER BY 1
ON CONFLICT (task) DO UPDATE
SET limits = excluded.limits, declared_at = GREATEST(d.declared_at, excluded.declared_at);

-- name: limit_declaration_list
-- Every task's limits as last declared, and when.
SELECT task, limits::text AS limits, declared_at
FROM __S__.oncebox_limit_declarations
ORDER BY task;
