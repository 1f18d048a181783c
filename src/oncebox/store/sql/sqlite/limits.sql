-- Rate buckets and channel pauses.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: rate_bucket_configure
-- :buckets is a JSON array of [name, capacity, refill_per_s].
-- no fence: follows the declaring code; tokens are only ever lowered to the capacity
INSERT INTO oncebox_rate_buckets AS rb (channel, name, capacity, refill_per_s, tokens, updated_at)
SELECT :channel, b.value ->> 0, b.value ->> 1, b.value ->> 2, b.value ->> 1, :now
FROM json_each(:buckets) AS b
WHERE true
ON CONFLICT (channel, name) DO UPDATE
SET capacity = excluded.capacity, refill_per_s = excluded.refill_per_s,
    tokens = min(rb.tokens, excluded.capacity);

-- name: rate_bucket_select
SELECT b.name, b.capacity, b.refill_per_s, b.tokens, b.updated_at, :now AS now,
       (SELECT paused_until FROM oncebox_channel_pauses WHERE channel = :channel) AS paused_until
FROM oncebox_rate_buckets b
WHERE b.channel = :channel AND b.name IN (SELECT value FROM json_each(:names))
ORDER BY b.name;

-- name: rate_bucket_update
-- :buckets is a JSON array of [name, tokens, updated_at].
-- fence: locked by rate_bucket_select
UPDATE oncebox_rate_buckets AS b
SET tokens = u.value ->> 1, updated_at = u.value ->> 2
FROM json_each(:buckets) AS u
WHERE b.channel = :channel AND b.name = u.value ->> 0;

-- name: channel_pause_read
SELECT :now AS now,
       (SELECT paused_until FROM oncebox_channel_pauses WHERE channel = :channel) AS paused_until;

-- name: channel_pause
-- no fence: a pause only ever lengthens (the later end wins), whoever writes first
INSERT INTO oncebox_channel_pauses AS p (channel, paused_until, reason)
VALUES (:channel, :now + :pause_us, :reason)
ON CONFLICT (channel) DO UPDATE
SET paused_until = max(p.paused_until, excluded.paused_until),
    reason = CASE WHEN excluded.paused_until > p.paused_until THEN excluded.reason
                  ELSE p.reason END
RETURNING paused_until;

-- name: limit_lock
-- The limits' rows for the whole limit. Nothing to lock: the lease holds the write lock.
-- no fence: takes the limit's lock; its update changes nothing
SELECT b.name, b.tokens, b.updated_at, :now AS now
FROM json_each(:names) AS n
JOIN oncebox_limits b ON b.name = n.value AND b.partition = '';

-- name: limit_spend
-- See the PostgreSQL statement (:spends: [name, partition, level before, at, [job ids]]): a
-- token for each job this lease's token holds. Under the write lock the lease skips nothing
-- it chose, so here that is every chosen job.
-- fence: state, lease_token, locked by limit_lock
INSERT INTO oncebox_limits AS l (name, partition, tokens, updated_at)
SELECT name, part, level - leased, at FROM (
    SELECT s.value ->> 0 AS name, s.value ->> 1 AS part, s.value ->> 2 AS level,
           s.value ->> 3 AS at,
           (SELECT count(*) FROM json_each(s.value -> 4) AS x
            JOIN oncebox_jobs j ON j.id = x.value
            WHERE j.state = 'leased' AND j.lease_token = :token) AS leased
    FROM json_each(:spends) AS s
)
WHERE leased > 0
ON CONFLICT (name, partition) DO UPDATE
SET tokens = excluded.tokens, updated_at = excluded.updated_at;

-- name: limit_declare
-- See the PostgreSQL statement (:declared: [task, limits as JSON text]).
-- no fence: a declaration is what the declaring process's code says, decided from no read;
-- declared_at only moves forward (max), and only a process that limits the task writes
INSERT INTO oncebox_limit_declarations AS d (task, limits, declared_at)
SELECT x.value ->> 0, x.value ->> 1, :now
FROM json_each(:declared) AS x
WHERE true
ON CONFLICT (task) DO UPDATE
SET limits = excluded.limits, declared_at = max(d.declared_at, excluded.declared_at);

-- name: limit_declaration_list
SELECT task, limits, declared_at
FROM oncebox_limit_declarations
ORDER BY task;
