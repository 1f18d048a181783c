-- Schedules and their fan-out runs.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: schedule_state_get
SELECT paused, last_fire_at, :now AS now FROM oncebox_schedules WHERE name = :name;

-- name: schedule_state_init
INSERT INTO oncebox_schedules (name, paused, last_fire_at, updated_at)
VALUES (:name, 0, :now - :grace_us, :now)
ON CONFLICT (name) DO NOTHING;

-- name: schedule_state_advance
-- no fence: the mark only moves forward (the greater of the two), whoever writes it
UPDATE oncebox_schedules
SET last_fire_at = max(COALESCE(last_fire_at, :at), :at), updated_at = :now
WHERE name = :name;

-- name: schedule_state_pause
-- no fence: an operator's pause or resume is the latest word on it (audited)
INSERT INTO oncebox_schedules AS s (name, paused, last_fire_at, updated_at)
VALUES (:name, :paused, :now, :now)
ON CONFLICT (name) DO UPDATE
SET paused = excluded.paused,
    last_fire_at = CASE WHEN excluded.paused THEN s.last_fire_at
                        ELSE max(s.last_fire_at, excluded.updated_at) END,
    updated_at = excluded.updated_at;

-- name: schedule_state_pause__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, CASE WHEN :paused THEN 'pause' ELSE 'resume' END, 'schedule', NULL, :name,
        :reason, NULL);

-- name: schedule_state_list
SELECT name, paused, last_fire_at FROM oncebox_schedules ORDER BY name;

-- name: schedule_slo_set
-- no fence: what the declaring code says, the same from every process of a release
UPDATE oncebox_schedules
SET slo_window_s = :window_s, slo_target = :target
WHERE name = :name
  AND (slo_window_s IS NOT :window_s OR slo_target IS NOT :target);

-- name: schedule_period_pace
-- See the PostgreSQL query.
SELECT count(*) AS done, min(leased_at) AS first_at, max(finished_at) AS last_at,
       count(DISTINCT leased_by) AS lanes
FROM oncebox_jobs
WHERE schedule = :schedule AND period = :period AND state = 'done' AND outcome = 'completed';

-- name: schedule_slo_list
SELECT name, slo_window_s AS window_s, slo_target AS target
FROM oncebox_schedules
WHERE slo_window_s IS NOT NULL
ORDER BY name;

-- name: schedule_run_claim
-- See the PostgreSQL statement.
-- A running run only once its lease ran out, a finished one only for a re-run:
-- fence: state, lease_expires_at
INSERT INTO oncebox_schedule_runs AS r
    (schedule, period, fire_at, state, owner, lease_expires_at, started_at, late, renewed_at)
VALUES (:schedule, :period, :fire_at, 'running', :owner, :now + :lease_us, :now, :late, :now)
ON CONFLICT (schedule, period) DO UPDATE
SET state = 'running',
    owner = excluded.owner,
    lease_expires_at = excluded.lease_expires_at,
    started_at = excluded.started_at,
    renewed_at = excluded.renewed_at,
    finished_at = NULL
WHERE (r.state = 'running' AND r.lease_expires_at < excluded.started_at)
   OR (r.state = 'done' AND :rescan)
RETURNING owner;

-- name: schedule_run_extend
-- fence: owner, state
UPDATE oncebox_schedule_runs
SET lease_expires_at = :now + :lease_us, renewed_at = :now,
    enqueued_count = enqueued_count + :enqueued
WHERE schedule = :schedule AND period = :period AND owner = :owner AND state = 'running'
RETURNING period;

-- name: schedule_run_renew
-- See the PostgreSQL statement.
-- fence: owner, state
UPDATE oncebox_schedule_runs
SET renewed_at = :now
WHERE schedule = :schedule AND period = :period AND owner = :owner AND state = 'running'
RETURNING period;

-- name: schedule_run_take_over
-- See the PostgreSQL statement; its audit row is the next step, in the same transaction.
-- fence: owner, lease_expires_at, renewed_at, state
UPDATE oncebox_schedule_runs
SET owner = :owner, lease_expires_at = :now + :lease_us, started_at = :now, renewed_at = :now
WHERE schedule = :schedule AND period = :period AND state = 'running'
  AND owner = :seen_owner AND lease_expires_at = :seen_lease
  AND renewed_at IS :seen_renewed
RETURNING schedule, period;

-- name: schedule_run_take_over__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'take-over', 'schedule', NULL, :schedule, :reason,
        json_object('period', :period, 'owner', :owner, 'owner_before', :seen_owner,
                    'renewed_at_before', :seen_renewed_text,
                    'lease_expires_at_before', :seen_lease_text))
RETURNING id;

-- name: schedule_run_get
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM oncebox_schedule_runs
WHERE schedule = :schedule AND period = :period;

-- name: schedule_run_running
-- See the PostgreSQL query.
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM oncebox_schedule_runs
WHERE state = 'running'
ORDER BY schedule, period;

-- name: schedule_run_finish
-- fence: owner, state
UPDATE oncebox_schedule_runs
SET state = 'done',
    finished_at = :now,
    lease_expires_at = NULL,
    scans = scans + 1,
    eligible_count = :eligible,
    enqueued_count = enqueued_count + :enqueued
WHERE schedule = :schedule AND period = :period AND owner = :owner AND state = 'running'
RETURNING period;

-- name: schedule_run_busy
SELECT period FROM oncebox_schedule_runs
WHERE schedule = :schedule AND state = 'running' AND period <> :period
  AND lease_expires_at >= :now
LIMIT 1;

-- name: schedule_run_list
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM oncebox_schedule_runs
WHERE schedule = :schedule
ORDER BY started_at DESC, period DESC
LIMIT :limit;

-- name: schedule_run_stalled
-- Fan-outs interrupted half-way: still `running`, their owner's lease run out. The scheduler
-- resumes them before any catch-up policy applies; oldest first.
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM oncebox_schedule_runs
WHERE schedule = :schedule AND state = 'running' AND lease_expires_at < :now
ORDER BY started_at, period;

-- name: schedule_period_stats
-- See the PostgreSQL query; :window_us is the SLO's window in microseconds (or NULL).
WITH runs AS (
    SELECT period, state, eligible_count, enqueued_count, fire_at, pruned_done, pruned_sent,
           pruned_on_time, owner, lease_expires_at, renewed_at, started_at
    FROM oncebox_schedule_runs
    WHERE schedule = :schedule
    ORDER BY period DESC
    LIMIT :limit
),
jobs AS (
    SELECT j.id, j.period, j.state, j.finished_at
    FROM oncebox_jobs j
    WHERE j.schedule = :schedule AND j.period IN (SELECT period FROM runs)
),
messages AS (
    SELECT o.job_id,
           max(o.sent_at) AS last_sent_at,
           count(*) FILTER (WHERE o.state = 'sent') AS sent,
           count(*) FILTER (WHERE o.state IN ('pending', 'leased', 'sending')) AS pending,
           count(*) FILTER (WHERE o.state = 'dead') AS dead,
           count(*) FILTER (WHERE o.state = 'ambiguous') AS ambiguous,
           sum(o.possible_duplicates) AS duplicates,
           count(*) FILTER (WHERE o.state <> 'sent') AS unsent
    FROM oncebox_outbox o
    WHERE o.job_id IN (SELECT id FROM jobs) AND o.discarded_at IS NULL
    GROUP BY o.job_id
),
per_period AS (
    SELECT j.period,
           count(*) FILTER (WHERE j.state = 'done') AS done,
           count(*) FILTER (WHERE j.state = 'done' AND COALESCE(m.unsent, 0) = 0) AS covered,
           COALESCE(sum(m.sent), 0) AS sent,
           count(*) FILTER (WHERE j.state IN ('ready', 'leased')) + COALESCE(sum(m.pending), 0)
               AS pending,
           count(*) FILTER (WHERE j.state = 'dead') + COALESCE(sum(m.dead), 0) AS dead,
           COALESCE(sum(m.ambiguous), 0) AS ambiguous,
           COALESCE(sum(m.duplicates), 0) AS duplicates,
           count(*) FILTER (WHERE j.state = 'dead' OR COALESCE(m.dead, 0) > 0) AS dead_subjects,
           count(*) FILTER (WHERE j.state <> 'dead' AND COALESCE(m.dead, 0) = 0
                              AND COALESCE(m.ambiguous, 0) > 0) AS held_subjects,
           count(*) FILTER (
               WHERE j.state = 'done' AND COALESCE(m.unsent, 0) = 0
                 AND COALESCE(m.last_sent_at, j.finished_at) <= r.fire_at + :window_us
           ) AS on_time
    FROM jobs j
    JOIN runs r ON r.period = j.period
    LEFT JOIN messages m ON m.job_id = j.id
    GROUP BY j.period
)
SELECT r.period, r.state, r.eligible_count AS eligible, r.enqueued_count AS enqueued,
       COALESCE(p.done, 0) + r.pruned_done AS done,
       COALESCE(p.covered, 0) + r.pruned_done AS covered,
       COALESCE(p.sent, 0) + r.pruned_sent AS sent, COALESCE(p.pending, 0) AS pending,
       COALESCE(p.dead, 0) AS dead, COALESCE(p.ambiguous, 0) AS ambiguous,
       r.fire_at,
       COALESCE(p.dead_subjects, 0) AS dead_subjects,
       COALESCE(p.held_subjects, 0) AS held_subjects,
       CASE WHEN :window_us IS NULL OR r.fire_at IS NULL THEN NULL
            ELSE COALESCE(p.on_time, 0) + r.pruned_on_time END AS on_time,
       COALESCE(p.duplicates, 0) AS duplicates,
       r.pruned_done AS pruned,
       CASE WHEN r.state = 'running' THEN r.owner END AS owner,
       CASE WHEN r.state = 'running' THEN r.lease_expires_at END AS lease_expires_at,
       CASE WHEN r.state = 'running' THEN r.renewed_at END AS renewed_at,
       r.started_at
FROM runs r LEFT JOIN per_period p ON p.period = r.period
ORDER BY r.period DESC;

-- name: schedule_run_prune
-- See the PostgreSQL statement.
-- fence: state, finished_at
DELETE FROM oncebox_schedule_runs
WHERE (schedule, period) IN (
    SELECT r.schedule, r.period FROM oncebox_schedule_runs r
    WHERE r.schedule = :schedule AND r.state = 'done'
      AND r.finished_at < :now - :older_than_us
      AND NOT EXISTS (SELECT 1 FROM oncebox_jobs j
                      WHERE j.schedule = r.schedule AND j.period = r.period)
    ORDER BY r.finished_at, r.period
    LIMIT :limit)
RETURNING period;

-- name: schedule_run_prunable
-- See the PostgreSQL query.
SELECT (SELECT min(finished_at) FROM oncebox_schedule_runs
        WHERE schedule = :schedule AND state = 'done') AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_schedule_runs r
            WHERE :older_than_us IS NOT NULL
              AND r.schedule = :schedule AND r.state = 'done'
              AND r.finished_at < :now - :older_than_us
              AND NOT EXISTS (SELECT 1 FROM oncebox_jobs j
                              WHERE j.schedule = r.schedule AND j.period = r.period)
            LIMIT :limit)) AS waiting;

-- name: schedule_run_schedules
-- See the PostgreSQL query: a skip scan of the primary key.
WITH RECURSIVE schedules(schedule) AS (
    SELECT (SELECT schedule FROM oncebox_schedule_runs ORDER BY schedule LIMIT 1)
    UNION ALL
    SELECT (SELECT r.schedule FROM oncebox_schedule_runs r WHERE r.schedule > s.schedule
            ORDER BY r.schedule LIMIT 1)
    FROM schedules s WHERE s.schedule IS NOT NULL
)
SELECT schedule AS name FROM schedules WHERE schedule IS NOT NULL;
