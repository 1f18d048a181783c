-- What operators read across the tables: the audit log, the status instants.
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

-- name: status_times
-- The instants operators and the demo watch: the oldest due ready job, the next job and message
-- to fall due, the oldest pending message, the next lease to run out.
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT
    (SELECT min(run_at) FROM __S__.oncebox_jobs
      WHERE state = 'ready' AND run_at <= (SELECT now FROM clock)) AS oldest_due_ready,
    (SELECT min(run_at) FROM __S__.oncebox_jobs WHERE state = 'ready') AS next_ready,
    (SELECT min(next_attempt_at) FROM __S__.oncebox_outbox WHERE state = 'pending')
        AS next_pending_message,
    (SELECT min(created_at) FROM __S__.oncebox_outbox WHERE state = 'pending')
        AS oldest_pending_message,
    (SELECT min(lease_expires_at) FROM __S__.oncebox_jobs WHERE state = 'leased')
        AS next_job_lease_end,
    (SELECT min(lease_expires_at) FROM __S__.oncebox_outbox
      WHERE state IN ('leased', 'sending')) AS next_message_lease_end,
    (SELECT now FROM clock) AS now;

-- name: backlog_list
-- Work not finished, per task (jobs) and per channel (messages): how much waits and when the
-- first of it falls due; how much a lease holds and when the first lease runs out. What
-- `worker --until-idle` reports on exit and `status` shows.
SELECT 'job' AS kind, task AS name,
       count(*) FILTER (WHERE state = 'ready') AS waiting,
       min(run_at) FILTER (WHERE state = 'ready') AS next_due_at,
       count(*) FILTER (WHERE state = 'leased') AS held,
       min(lease_expires_at) FILTER (WHERE state = 'leased') AS held_until
FROM __S__.oncebox_jobs WHERE state IN ('ready', 'leased') GROUP BY task
UNION ALL
SELECT 'message', channel,
       count(*) FILTER (WHERE state = 'pending'),
       min(next_attempt_at) FILTER (WHERE state = 'pending'),
       count(*) FILTER (WHERE state IN ('leased', 'sending')),
       min(lease_expires_at) FILTER (WHERE state IN ('leased', 'sending'))
FROM __S__.oncebox_outbox WHERE state IN ('pending', 'leased', 'sending') GROUP BY channel
ORDER BY 1, 2;
