-- What operators read across the tables (the audit log, the status instants), and the audit
-- entries that go with no change of a row of their own.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: audit_list
SELECT id, at, actor, action, target_kind, target_id, target_key, reason, details
FROM oncebox_audit
WHERE (:target_id IS NULL OR target_id = :target_id)
  AND (:action IS NULL OR action = :action)
  AND (:key IS NULL OR target_key = :key)
  AND (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- name: audit_append
-- An entry that goes with no change of a row of its own (a refused console login).
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, :action, :target_kind, NULL, :target_key, :reason, :details)
RETURNING id;

-- name: status_times
-- See the PostgreSQL query: each instant is the first entry of an index.
WITH firsts AS (  -- each task's first ready job, as job_next_due finds it
    SELECT (SELECT j.run_at FROM oncebox_jobs j
            WHERE j.state = 'ready' AND j.task = t.name
            ORDER BY j.task, j.run_at LIMIT 1) AS run_at
    FROM (SELECT name FROM oncebox_depths WHERE kind = 'job' AND state = 'ready'
          GROUP BY name HAVING sum(value) > 0) t
)
SELECT
    (SELECT min(run_at) FROM firsts WHERE run_at <= :now) AS oldest_due_ready,
    (SELECT min(run_at) FROM firsts) AS next_ready,
    (SELECT min((SELECT o.next_attempt_at FROM oncebox_outbox o
                 WHERE o.state = 'pending' AND o.channel = c.name
                 ORDER BY o.next_attempt_at, o.id LIMIT 1))
     FROM (SELECT name FROM oncebox_depths
           WHERE kind = 'message' AND state = 'pending'
           GROUP BY name HAVING sum(value) > 0) c) AS next_pending_message,
    (SELECT created_at FROM oncebox_outbox WHERE state = 'pending'
      ORDER BY created_at LIMIT 1) AS oldest_pending_message,
    (SELECT lease_expires_at FROM oncebox_jobs WHERE state = 'leased'
      ORDER BY lease_expires_at LIMIT 1) AS next_job_lease_end,
    (SELECT lease_expires_at FROM oncebox_outbox WHERE state IN ('leased', 'sending')
      ORDER BY lease_expires_at LIMIT 1) AS next_message_lease_end,
    :now AS now,
    (SELECT count(*) FROM oncebox_jobs WHERE state = 'leased' AND lease_expires_at < :now)
        AS jobs_past_lease,
    (SELECT count(*) FROM oncebox_outbox
      WHERE state IN ('leased', 'sending') AND lease_expires_at < :now) AS messages_past_lease;

-- name: backlog_list
-- See the PostgreSQL query: counts from the depths (0010), instants from index probes.
WITH depths AS (
    SELECT kind, name,
           sum(value) FILTER (WHERE state IN ('ready', 'pending')) AS waiting,
           sum(value) FILTER (WHERE state IN ('leased', 'sending')) AS held
    FROM oncebox_depths
    WHERE state IN ('ready', 'pending', 'leased', 'sending')
    GROUP BY kind, name
    HAVING sum(value) > 0
)
SELECT 'job' AS kind, d.name, COALESCE(d.waiting, 0) AS waiting,
       CASE WHEN d.waiting > 0 THEN
           (SELECT j.run_at FROM oncebox_jobs j
            WHERE j.state = 'ready' AND j.task = d.name
            ORDER BY j.task, j.run_at LIMIT 1)  -- oncebox_jobs_task_due's first entry
       END AS next_due_at,
       COALESCE(d.held, 0) AS held,
       CASE WHEN d.held > 0 THEN
           (SELECT min(j.lease_expires_at) FROM oncebox_jobs j
            WHERE j.state = 'leased' AND j.task = d.name)
       END AS held_until
FROM depths d WHERE d.kind = 'job'
UNION ALL
SELECT 'message', d.name, COALESCE(d.waiting, 0),
       CASE WHEN d.waiting > 0 THEN
           (SELECT o.next_attempt_at FROM oncebox_outbox o
            WHERE o.state = 'pending' AND o.channel = d.name
            ORDER BY o.next_attempt_at, o.id LIMIT 1)
       END,
       COALESCE(d.held, 0),
       CASE WHEN d.held > 0 THEN
           (SELECT min(o.lease_expires_at) FROM oncebox_outbox o
            WHERE o.state IN ('leased', 'sending') AND o.channel = d.name)
       END
FROM depths d WHERE d.kind = 'message'
ORDER BY 1, 2;

-- name: audit_prune
-- See the PostgreSQL statement.
-- no fence: audit entries are never changed once written; a batch is taken with SKIP LOCKED
DELETE FROM oncebox_audit
WHERE id IN (
    SELECT a.id FROM oncebox_audit a
    WHERE a.at < :now - :older_than_us
      AND NOT EXISTS (SELECT 1 FROM oncebox_jobs j
                      WHERE a.target_kind = 'job' AND j.id = a.target_id AND j.state = 'dead')
      AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o
                      WHERE a.target_kind = 'delivery' AND o.id = a.target_id
                        AND o.state IN ('dead', 'ambiguous'))
    ORDER BY a.at, a.id
    LIMIT :limit)
RETURNING id;

-- name: audit_prunable
-- See the PostgreSQL query.
SELECT (SELECT min(at) FROM oncebox_audit) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_audit a
            WHERE :older_than_us IS NOT NULL AND a.at < :now - :older_than_us
              AND NOT EXISTS (SELECT 1 FROM oncebox_jobs j
                              WHERE a.target_kind = 'job' AND j.id = a.target_id
                                AND j.state = 'dead')
              AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o
                              WHERE a.target_kind = 'delivery' AND o.id = a.target_id
                                AND o.state IN ('dead', 'ambiguous'))
            LIMIT :limit)) AS waiting;
