-- Durable counters: added to in the transactions that do what they count, summed on read.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py. The statements that settle
-- jobs and messages (jobs.sql, outbox.sql) add to the same table in their own CTEs, with the
-- same shard and the same conflict clause as counter_add.

-- name: counter_add
-- %(deltas)s is a JSON object {name: amount}; added to this connection's shard, in name order
-- (one lock order for every writer).
INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
SELECT d.key, mod(pg_backend_pid(), 256), d.value::bigint
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
