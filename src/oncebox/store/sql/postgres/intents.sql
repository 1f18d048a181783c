-- Intents: the claims of business keys.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

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
-- no fence: undoes claims made earlier in this same transaction, which no other transaction sees
DELETE FROM __S__.oncebox_intents WHERE key = ANY(%(keys)s::text[]);

-- name: intent_get
SELECT key, task, job_id, claimed_at FROM __S__.oncebox_intents WHERE key = %(key)s;

-- name: intent_count
SELECT count(*) AS count FROM __S__.oncebox_intents;

-- name: intent_prune
-- A task's explicit intent-retention policy: delete a batch of its intents claimed before the
-- cutoff. Never run as a side effect of pruning jobs.
-- fence: task, claimed_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT key FROM __S__.oncebox_intents
    WHERE task = %(task)s
      AND claimed_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
    ORDER BY claimed_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED  -- pruners in several workers take different batches
)
DELETE FROM __S__.oncebox_intents i USING doomed d WHERE i.key = d.key RETURNING i.key;

-- name: intent_prunable
-- What a task's intent policy holds: when its oldest intent was claimed, and how many
-- intent_prune would delete now (up to %(limit)s; none when %(older_than_s)s is NULL: the
-- task keeps its intents for ever, the default).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT (SELECT min(claimed_at) FROM __S__.oncebox_intents WHERE task = %(task)s) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_intents
            WHERE %(older_than_s)s::float8 IS NOT NULL AND task = %(task)s
              AND claimed_at < (SELECT now FROM clock)
                               - make_interval(secs => %(older_than_s)s::float8)
            LIMIT %(limit)s) w) AS waiting;

-- name: intent_tasks
-- The tasks that hold intents (a registry may no longer declare one: its policy is the default),
-- one probe of oncebox_intents_task_claimed per task (a skip scan): a DISTINCT read every
-- intent, 0.3 s a call at 3 000 000 of them (bench/retention.py), and intents are kept for ever.
WITH RECURSIVE tasks AS (
    (SELECT task FROM __S__.oncebox_intents ORDER BY task LIMIT 1)
    UNION ALL
    SELECT (SELECT i.task FROM __S__.oncebox_intents i WHERE i.task > t.task
            ORDER BY i.task LIMIT 1)
    FROM tasks t WHERE t.task IS NOT NULL
)
SELECT task AS name FROM tasks WHERE task IS NOT NULL;
