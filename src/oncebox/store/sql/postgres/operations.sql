-- What operators read across the tables (the audit log, the status instants), and the audit
-- entries that go with no change of a row of their own.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: audit_list
SELECT id, at, actor, action, target_kind, target_id, target_key, reason, details::text
FROM __S__.oncebox_audit
WHERE (%(target_id)s::bigint IS NULL OR target_id = %(target_id)s::bigint)
  AND (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(key)s::text IS NULL OR target_key = %(key)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: audit_append
-- An entry that goes with no change of a row of its own (a refused console login).
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (__S__.oncebox_now(), %(actor)s, %(action)s, %(target_kind)s, NULL, %(target_key)s,
        %(reason)s, %(details)s::jsonb)
RETURNING id;

-- name: status_times
-- The instants operators and the demo watch: the oldest due ready job, the next job and message
-- to fall due, the oldest pending message, the next lease to run out. Each is the first entry
-- of an index: no scan of a backlog. Leased jobs are read through the leases' own rows (0024).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
held AS MATERIALIZED (
    SELECT j.lease_expires_at
    FROM __S__.oncebox_jobs j
    WHERE j.id = ANY(ARRAY(SELECT unnest(ids) FROM __S__.oncebox_job_leases))
      AND j.state = 'leased'
),
firsts AS (  -- each task's first ready job, as job_next_due finds it (a task with ready jobs:
             -- the first row from it on is its own)
    SELECT f.run_at
    FROM (SELECT name FROM __S__.oncebox_depths WHERE kind = 'job' AND state = 'ready'
          GROUP BY name HAVING sum(value) > 0) t,
         LATERAL (SELECT j.run_at FROM __S__.oncebox_jobs j
                  WHERE j.stage = 'ready' AND j.state = 'ready' AND j.task >= t.name
                  ORDER BY j.task, j.run_at LIMIT 1) f
)
SELECT
    (SELECT min(run_at) FROM firsts WHERE run_at <= (SELECT now FROM clock))
        AS oldest_due_ready,
    (SELECT min(run_at) FROM firsts) AS next_ready,
    (SELECT min(f.next_attempt_at)
     FROM (SELECT name FROM __S__.oncebox_depths
           WHERE kind = 'message' AND state = 'pending'
           GROUP BY name HAVING sum(value) > 0) c,
          LATERAL (SELECT o.channel, o.next_attempt_at FROM __S__.oncebox_outbox o
                   WHERE o.state = 'pending' AND o.channel >= c.name  -- see outbox_next_due
                   ORDER BY o.channel, o.next_attempt_at LIMIT 1) f
     WHERE f.channel = c.name) AS next_pending_message,
    (SELECT created_at FROM __S__.oncebox_outbox WHERE state = 'pending'
      ORDER BY created_at LIMIT 1) AS oldest_pending_message,
    (SELECT min(lease_expires_at) FROM held) AS next_job_lease_end,
    (SELECT lease_expires_at FROM __S__.oncebox_outbox WHERE state IN ('leased', 'sending')
      ORDER BY lease_expires_at LIMIT 1) AS next_message_lease_end,
    (SELECT now FROM clock) AS now,
    -- leases run out and not yet rescued: jobs through the leases' rows, messages through the
    -- outbox's leased index (leases are few)
    (SELECT count(*) FROM held
      WHERE lease_expires_at < (SELECT now FROM clock)) AS jobs_past_lease,
    (SELECT count(*) FROM __S__.oncebox_outbox
      WHERE state IN ('leased', 'sending') AND lease_expires_at < (SELECT now FROM clock))
        AS messages_past_lease;

-- name: backlog_list
-- Work not finished, per task (jobs) and per channel (messages): how much waits and when the
-- first of it falls due; how much a lease holds and when the first lease runs out. What
-- `worker --until-idle` reports on exit and `status` shows. The counts come from the depths
-- (0010); the instants are index probes per task or channel (leases are few: at most a batch
-- per worker).
WITH depths AS (
    SELECT kind, name,
           sum(value) FILTER (WHERE state IN ('ready', 'relayed', 'pending'))::bigint AS waiting,
           sum(value) FILTER (WHERE state IN ('leased', 'sending'))::bigint AS held
    FROM __S__.oncebox_depths
    WHERE state IN ('ready', 'relayed', 'pending', 'leased', 'sending')
    GROUP BY kind, name
    HAVING sum(value) > 0
)
SELECT 'job' AS kind, d.name, COALESCE(d.waiting, 0) AS waiting,
       CASE WHEN d.waiting > 0 THEN
           (SELECT j.run_at FROM __S__.oncebox_jobs j  -- see status_times' firsts
            WHERE j.stage = 'ready' AND j.state = 'ready' AND j.task >= d.name
            ORDER BY j.task, j.run_at LIMIT 1)
       END AS next_due_at,
       COALESCE(d.held, 0) AS held,
       CASE WHEN d.held > 0 THEN
           (SELECT min(j.lease_expires_at) FROM __S__.oncebox_jobs j  -- see status_times
            WHERE j.id = ANY(ARRAY(SELECT unnest(ids) FROM __S__.oncebox_job_leases))
              AND j.state = 'leased' AND j.task = d.name)
       END AS held_until
FROM depths d WHERE d.kind = 'job'
UNION ALL
SELECT 'message', d.name, COALESCE(d.waiting, 0),
       CASE WHEN d.waiting > 0 THEN
           (SELECT o.next_attempt_at FROM __S__.oncebox_outbox o
            WHERE o.state = 'pending' AND o.channel >= d.name  -- see outbox_next_due
            ORDER BY o.channel, o.next_attempt_at LIMIT 1)
       END,
       COALESCE(d.held, 0),
       CASE WHEN d.held > 0 THEN
           (SELECT min(o.lease_expires_at) FROM __S__.oncebox_outbox o
            WHERE o.state IN ('leased', 'sending') AND o.channel = d.name)
       END
FROM depths d WHERE d.kind = 'message'
ORDER BY 1, 2;

-- name: audit_prune
-- Delete a batch of audit entries older than the cutoff, oldest first (oncebox_audit_at, 0014),
-- except those about a dead job or a dead or ambiguous message: a dead letter keeps its whole
-- story until it is replayed, discarded or resolved.
-- no fence: audit entries are never changed once written; a batch is taken with SKIP LOCKED
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT a.id FROM __S__.oncebox_audit a
    WHERE a.at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_jobs j
                      WHERE a.target_kind = 'job' AND j.id = a.target_id AND j.state = 'dead')
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox o
                      WHERE a.target_kind = 'delivery' AND o.id = a.target_id
                        AND o.state IN ('dead', 'ambiguous'))
    ORDER BY a.at, a.id
    LIMIT %(limit)s
    FOR UPDATE OF a SKIP LOCKED  -- pruners in several workers take different batches
)
DELETE FROM __S__.oncebox_audit a
WHERE a.id = ANY(ARRAY(SELECT id FROM doomed))  -- by key, whatever the statistics
RETURNING a.id;

-- name: audit_prunable
-- What retention holds of the audit log: its oldest entry, and how many audit_prune would delete
-- now (up to %(limit)s).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT (SELECT min(at) FROM __S__.oncebox_audit) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_audit a
            WHERE %(older_than_s)s::float8 IS NOT NULL
              AND a.at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s::float8)
              AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_jobs j
                              WHERE a.target_kind = 'job' AND j.id = a.target_id
                                AND j.state = 'dead')
              AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_outbox o
                              WHERE a.target_kind = 'delivery' AND o.id = a.target_id
                                AND o.state IN ('dead', 'ambiguous'))
            LIMIT %(limit)s) w) AS waiting;
