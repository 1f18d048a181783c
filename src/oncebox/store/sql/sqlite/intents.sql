-- Intents: the claims of business keys.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

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
-- no fence: undoes claims made earlier in this same transaction, which no other transaction sees
DELETE FROM oncebox_intents WHERE key IN (SELECT value FROM json_each(:keys));

-- name: intent_get
SELECT key, task, job_id, claimed_at FROM oncebox_intents WHERE key = :key;

-- name: intent_count
SELECT count(*) AS count FROM oncebox_intents;

-- name: intent_prune
-- fence: task, claimed_at
DELETE FROM oncebox_intents
WHERE key IN (
    SELECT key FROM oncebox_intents
    WHERE task = :task AND claimed_at < :now - :older_than_us
    ORDER BY claimed_at
    LIMIT :limit)
RETURNING key;

-- name: intent_prunable
-- See the PostgreSQL query.
SELECT (SELECT min(claimed_at) FROM oncebox_intents WHERE task = :task) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_intents
            WHERE :older_than_us IS NOT NULL AND task = :task
              AND claimed_at < :now - :older_than_us
            LIMIT :limit)) AS waiting;

-- name: intent_tasks
-- See the PostgreSQL query: a skip scan of oncebox_intents_task_claimed.
WITH RECURSIVE tasks(task) AS (
    SELECT (SELECT task FROM oncebox_intents ORDER BY task LIMIT 1)
    UNION ALL
    SELECT (SELECT i.task FROM oncebox_intents i WHERE i.task > t.task
            ORDER BY i.task LIMIT 1)
    FROM tasks t WHERE t.task IS NOT NULL
)
SELECT task AS name FROM tasks WHERE task IS NOT NULL;
