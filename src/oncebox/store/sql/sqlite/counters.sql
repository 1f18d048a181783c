-- Durable counters: added to in the transactions that do what they count, summed on read.
-- SQLite; this folder's conventions are in store/sqlfiles.py. One shard: one writer at a time.

-- name: counter_add
-- :deltas is a JSON object {name: amount}.
INSERT INTO oncebox_counters AS c (name, shard, value)
SELECT d.key, 0, d.value
FROM json_each(:deltas) AS d
WHERE d.value <> 0
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: counter_list
-- Every counter, its shards summed.
SELECT name, sum(value) AS value
FROM oncebox_counters
GROUP BY name
ORDER BY name;

-- The counting steps of the statements that settle jobs and messages: PostgreSQL counts in the
-- statements themselves (a data-modifying CTE each), SQLite in a step of the same transaction.
-- Each mirrors its PostgreSQL CTE, name for name.

-- name: job_insert__count
-- :created is 1 when job_insert wrote the job, 0 when the key held it off.
INSERT INTO oncebox_counters AS c (name, shard, value)
VALUES (CASE WHEN :created THEN 'jobs_enqueued' ELSE 'enqueue_duplicates' END, 0, 1)
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: job_merge__count
INSERT INTO oncebox_counters AS c (name, shard, value)
VALUES ('enqueue_collapsed', 0, 1)
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: job_insert_many__count
INSERT INTO oncebox_counters AS c (name, shard, value)
SELECT n.name, 0, n.value
FROM (SELECT 'enqueue_duplicates' AS name, :offered - :created AS value
      UNION ALL
      SELECT 'jobs_enqueued', :created) AS n
WHERE n.value > 0
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: job_finish__count
-- :rows is job_finish's input, :settled the ids it settled.
INSERT INTO oncebox_counters AS c (name, shard, value)
SELECT CASE WHEN i.value ->> 1 = 'done' AND i.value ->> 2 = 'duplicate' THEN 'claim_conflicts'
            WHEN i.value ->> 1 = 'done' THEN 'jobs_completed'
            WHEN i.value ->> 1 = 'ready' THEN 'jobs_retried'
            ELSE 'jobs_dead' END AS name,
       0, count(*)
FROM json_each(:rows) AS i
WHERE i.value ->> 0 IN (SELECT value FROM json_each(:settled))
GROUP BY 1
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: job_rescue_expired__count
INSERT INTO oncebox_counters AS c (name, shard, value)
SELECT n.name, 0, n.value
FROM (SELECT 'jobs_dead' AS name, :dead AS value
      UNION ALL
      SELECT 'leases_expired', :rescued) AS n
WHERE n.value > 0
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: outbox_finish__count
-- :rows is outbox_finish's input ([id, state, outcome, counts, delay, error, receipt, dup,
-- uncertain, rescued]), :settled the ids it settled.
INSERT INTO oncebox_counters AS c (name, shard, value)
SELECT v.column1, 0, count(*)
FROM json_each(:rows) AS i,
     (VALUES ('sends_ambiguous'), ('sends_dead'), ('sends_lease_expired'),
             ('sends_possible_duplicate'), ('sends_resent'), ('sends_retried'),
             ('sends_sent'), ('sends_throttled'), ('sends_waited')) AS v
WHERE i.value ->> 0 IN (SELECT value FROM json_each(:settled))
  AND CASE v.column1
          WHEN 'sends_sent' THEN i.value ->> 1 = 'sent'
          WHEN 'sends_retried' THEN i.value ->> 2 = 'failed'
          WHEN 'sends_throttled' THEN i.value ->> 2 = 'throttled'
          WHEN 'sends_dead' THEN i.value ->> 1 = 'dead'
          WHEN 'sends_ambiguous' THEN i.value ->> 1 = 'ambiguous'
          WHEN 'sends_resent' THEN i.value ->> 1 = 'pending'
                                    AND i.value ->> 2 IN ('ambiguous', 'lease_expired')
          WHEN 'sends_possible_duplicate' THEN i.value ->> 7 = 1
          WHEN 'sends_lease_expired' THEN i.value ->> 9 = 1
          WHEN 'sends_waited' THEN i.value ->> 1 = 'pending' AND i.value ->> 2 IS NULL
                                   AND NOT i.value ->> 9
      END
GROUP BY v.column1
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: depth_names
-- See the PostgreSQL query.
SELECT name FROM oncebox_depths
WHERE kind = :kind AND state IN (SELECT value FROM json_each(:states))
GROUP BY name HAVING sum(value) > 0
ORDER BY name;
