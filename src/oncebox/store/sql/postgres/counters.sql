-- Durable counters: added to in the transactions that do what they count, summed on read.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py. The statements that settle
-- jobs and messages (jobs.sql, outbox.sql) add to the same table in their own CTEs, with the
-- same shard and the same conflict clause as counter_add. The shard is the writing connection's
-- backend pid: no two live connections share one, so no transaction ever waits for another's
-- counter rows; counter_compact folds the shards of connections that are gone into shard 0.

-- name: counter_add
-- %(deltas)s is a JSON object {name: amount}; added to this connection's shard, in name order
-- (one lock order for every writer).
INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
SELECT d.key, pg_backend_pid(), d.value::bigint
FROM jsonb_each_text(%(deltas)s::jsonb) AS d
WHERE d.value::bigint <> 0
ORDER BY d.key
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: counter_list
-- Every counter, its shards summed.
SELECT name, sum(value)::bigint AS value
FROM __S__.oncebox_counters
GROUP BY name
ORDER BY name;

-- name: counter_compact
-- Fold the shards of backends that are gone into shard 0 (the pruner, now and then), so the
-- counters and the depths (0010) stay about the size of the live connections times their
-- names. A backend whose pid is reused after its rows were read simply adds to a fresh row.
-- no fence: folds only the shards of backends that are gone, which no one writes any more
WITH live AS MATERIALIZED (SELECT pid FROM pg_stat_activity),
gone_depths AS (
    DELETE FROM __S__.oncebox_depths
    WHERE shard <> 0 AND shard NOT IN (SELECT pid FROM live)
    RETURNING kind, name, queue, state, outcome, value
),
depths_folded AS (
    INSERT INTO __S__.oncebox_depths AS d (kind, name, queue, state, outcome, shard, value)
    SELECT kind, name, queue, state, outcome, 0, sum(value)
    FROM gone_depths
    GROUP BY 1, 2, 3, 4, 5
    ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (kind, name, queue, state, outcome, shard)
    DO UPDATE SET value = d.value + excluded.value
),
gone AS (
    DELETE FROM __S__.oncebox_counters
    WHERE shard <> 0 AND shard NOT IN (SELECT pid FROM live)
    RETURNING name, value
)
INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
SELECT name, 0, sum(value)
FROM gone
GROUP BY name
ORDER BY name
ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value;

-- name: depth_names
-- The tasks (kind 'job') or channels ('message') that have rows in any of %(states)s, from the
-- depths (0010): which names the pruner visits, without reading the tables.
SELECT name FROM __S__.oncebox_depths
WHERE kind = %(kind)s AND state = ANY(%(states)s::text[])
GROUP BY name HAVING sum(value) > 0
ORDER BY name;
