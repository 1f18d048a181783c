-- The live workers: what each serves, and when it was last seen.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: worker_beat
-- A worker's row, written at start and refreshed while it runs (started_at kept).
-- no fence: a worker writes only its own row, and forgets rows no one has written for a day
INSERT INTO oncebox_workers AS w
    (name, host, pid, tasks, queues, channels, started_at, seen_at, stopped_at)
VALUES (:name, :host, :pid, :tasks, :queues, :channels, :now, :now, NULL)
ON CONFLICT (name) DO UPDATE
SET tasks = excluded.tasks, queues = excluded.queues, channels = excluded.channels,
    seen_at = excluded.seen_at, stopped_at = NULL;

-- name: worker_beat__forget
-- Workers not seen for a day are forgotten (the table stays the size of the fleet).
-- no fence: forgets rows no one has written for a day
DELETE FROM oncebox_workers WHERE seen_at < :now - 86400000000 AND name <> :name;

-- name: worker_stop
-- no fence: a worker writes only its own row
UPDATE oncebox_workers SET stopped_at = :now, seen_at = :now WHERE name = :name;

-- name: worker_list
-- `live`: seen within :live_us and not stopped.
SELECT name, host, pid, tasks, queues, channels, started_at, seen_at, stopped_at,
       stopped_at IS NULL AND seen_at >= :now - :live_us AS live
FROM oncebox_workers
ORDER BY name;
