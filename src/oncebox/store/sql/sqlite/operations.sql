-- What operators read across the tables: the audit log, the status instants.
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

-- name: status_times
SELECT
    (SELECT min(run_at) FROM oncebox_jobs WHERE state = 'ready' AND run_at <= :now)
        AS oldest_due_ready,
    (SELECT min(run_at) FROM oncebox_jobs WHERE state = 'ready') AS next_ready,
    (SELECT min(next_attempt_at) FROM oncebox_outbox WHERE state = 'pending')
        AS next_pending_message,
    (SELECT min(created_at) FROM oncebox_outbox WHERE state = 'pending')
        AS oldest_pending_message,
    (SELECT min(lease_expires_at) FROM oncebox_jobs WHERE state = 'leased')
        AS next_job_lease_end,
    (SELECT min(lease_expires_at) FROM oncebox_outbox WHERE state IN ('leased', 'sending'))
        AS next_message_lease_end,
    :now AS now;

-- name: backlog_list
-- Work not finished, per task (jobs) and per channel (messages): how much waits and when the
-- first of it falls due; how much a lease holds and when the first lease runs out. What
-- `worker --until-idle` reports on exit and `status` shows.
SELECT 'job' AS kind, task AS name,
       count(*) FILTER (WHERE state = 'ready') AS waiting,
       min(run_at) FILTER (WHERE state = 'ready') AS next_due_at,
       count(*) FILTER (WHERE state = 'leased') AS held,
       min(lease_expires_at) FILTER (WHERE state = 'leased') AS held_until
FROM oncebox_jobs WHERE state IN ('ready', 'leased') GROUP BY task
UNION ALL
SELECT 'message', channel,
       count(*) FILTER (WHERE state = 'pending'),
       min(next_attempt_at) FILTER (WHERE state = 'pending'),
       count(*) FILTER (WHERE state IN ('leased', 'sending')),
       min(lease_expires_at) FILTER (WHERE state IN ('leased', 'sending'))
FROM oncebox_outbox WHERE state IN ('pending', 'leased', 'sending') GROUP BY channel
ORDER BY 1, 2;
