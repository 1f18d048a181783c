-- The live workers: what each serves, and when it was last seen.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: worker_beat
-- A worker's row, written at start and refreshed while it runs (started_at kept); workers not
-- seen for a day are forgotten in the same statement (the table stays the size of the fleet).
-- no fence: a worker writes only its own row, and forgets rows no one has written for a day
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
forgotten AS (
    DELETE FROM __S__.oncebox_workers
    WHERE seen_at < (SELECT now FROM clock) - interval '1 day' AND name <> %(name)s
)
INSERT INTO __S__.oncebox_workers AS w
    (name, host, pid, tasks, queues, channels, started_at, seen_at, stopped_at)
SELECT %(name)s, %(host)s, %(pid)s, %(tasks)s::jsonb, %(queues)s::jsonb, %(channels)s::jsonb,
       clock.now, clock.now, NULL
FROM clock
ON CONFLICT (name) DO UPDATE
SET tasks = excluded.tasks, queues = excluded.queues, channels = excluded.channels,
    seen_at = excluded.seen_at, stopped_at = NULL;

-- name: worker_stop
-- no fence: a worker writes only its own row
UPDATE __S__.oncebox_workers
SET stopped_at = __S__.oncebox_now(), seen_at = __S__.oncebox_now()
WHERE name = %(name)s;

-- name: worker_list
-- `live`: seen within %(live_s)s seconds and not stopped.
SELECT name, host, pid, tasks::text AS tasks, queues::text AS queues,
       channels::text AS channels, started_at, seen_at, stopped_at,
       stopped_at IS NULL
       AND seen_at >= __S__.oncebox_now() - make_interval(secs => %(live_s)s) AS live
FROM __S__.oncebox_workers
ORDER BY name;
