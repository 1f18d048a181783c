-- Schedules and their fan-out runs.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: schedule_state_get
SELECT paused, last_fire_at, (SELECT __S__.oncebox_now()) AS now
FROM __S__.oncebox_schedules WHERE name = %(name)s;

-- name: schedule_state_init
-- First sight of a schedule: it starts `grace` ago (a fire that just passed still runs), not at
-- the beginning of time (no backfill of a history it never had).
INSERT INTO __S__.oncebox_schedules (name, paused, last_fire_at, updated_at)
SELECT %(name)s, false, c.now - make_interval(secs => %(grace_s)s), c.now
FROM (SELECT __S__.oncebox_now() AS now) c
ON CONFLICT (name) DO NOTHING;

-- name: schedule_state_advance
-- no fence: the mark only moves forward (the greater of the two), whoever writes it
UPDATE __S__.oncebox_schedules
SET last_fire_at = GREATEST(COALESCE(last_fire_at, %(at)s), %(at)s),
    updated_at = (SELECT __S__.oncebox_now())
WHERE name = %(name)s;

-- name: schedule_state_pause
-- Pause or resume; resuming starts from now: fires missed while paused are skipped on purpose.
-- no fence: an operator's pause or resume is the latest word on it (audited)
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_schedules AS s (name, paused, last_fire_at, updated_at)
SELECT %(name)s, %(paused)s, clock.now, clock.now FROM clock
ON CONFLICT (name) DO UPDATE
SET paused = excluded.paused,
    last_fire_at = CASE WHEN excluded.paused THEN s.last_fire_at
                        ELSE GREATEST(s.last_fire_at, excluded.updated_at) END,
    updated_at = excluded.updated_at;

-- name: schedule_state_pause__audit
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (__S__.oncebox_now(), %(actor)s, CASE WHEN %(paused)s THEN 'pause' ELSE 'resume' END,
        'schedule', NULL, %(name)s, %(reason)s, NULL);

-- name: schedule_state_list
SELECT name, paused, last_fire_at FROM __S__.oncebox_schedules ORDER BY name;

-- name: schedule_slo_set
-- The SLO the declaring code gives the schedule (NULLs: none); a row unchanged is not written.
-- no fence: what the declaring code says, the same from every process of a release
UPDATE __S__.oncebox_schedules
SET slo_window_s = %(window_s)s::float8, slo_target = %(target)s::float8
WHERE name = %(name)s
  AND (slo_window_s IS DISTINCT FROM %(window_s)s::float8
       OR slo_target IS DISTINCT FROM %(target)s::float8);

-- name: schedule_period_pace
-- How fast a period's jobs were done (for `oncebox plan`): how many completed, from the first
-- lease to the last completion, by how many consumer lanes.
SELECT count(*) AS done, min(leased_at) AS first_at, max(finished_at) AS last_at,
       count(DISTINCT leased_by) AS lanes
FROM __S__.oncebox_all_jobs
WHERE schedule = %(schedule)s AND period = %(period)s AND state = 'done'
  AND outcome = 'completed';

-- name: schedule_slo_list
SELECT name, slo_window_s AS window_s, slo_target AS target
FROM __S__.oncebox_schedules
WHERE slo_window_s IS NOT NULL
ORDER BY name;

-- name: schedule_run_claim
-- Take a period's fan-out: a new run, a run whose owner's lease ran out, or — a manual re-run —
-- a finished one. Returns a row only when this owner now has it.
-- A running run only once its lease ran out, a finished one only for a re-run:
-- fence: state, lease_expires_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_schedule_runs AS r
    (schedule, period, fire_at, state, owner, lease_expires_at, started_at, late, renewed_at)
SELECT %(schedule)s, %(period)s, %(fire_at)s::timestamptz, 'running', %(owner)s,
       clock.now + make_interval(secs => %(lease_s)s), clock.now, %(late)s, clock.now
FROM clock
ON CONFLICT (schedule, period) DO UPDATE
SET state = 'running',
    owner = excluded.owner,
    lease_expires_at = excluded.lease_expires_at,
    started_at = excluded.started_at,
    renewed_at = excluded.renewed_at,
    finished_at = NULL
WHERE (r.state = 'running' AND r.lease_expires_at < excluded.started_at)
   OR (r.state = 'done' AND %(rescan)s)
RETURNING r.owner;

-- name: schedule_run_extend
-- Between batches: keep the lease, count what was enqueued; nothing if the run was taken over.
-- fence: owner, state
UPDATE __S__.oncebox_schedule_runs
SET lease_expires_at = (SELECT __S__.oncebox_now()) + make_interval(secs => %(lease_s)s),
    renewed_at = (SELECT __S__.oncebox_now()),
    enqueued_count = enqueued_count + %(enqueued)s
WHERE schedule = %(schedule)s AND period = %(period)s AND owner = %(owner)s
  AND state = 'running'
RETURNING period;

-- name: schedule_run_renew
-- An owner's sign of life while it fans out (schedules/owners.py), batches or not: the lease is
-- kept by progress alone (schedule_run_extend); nothing if the run was taken over or finished.
-- fence: owner, state
UPDATE __S__.oncebox_schedule_runs
SET renewed_at = (SELECT __S__.oncebox_now())
WHERE schedule = %(schedule)s AND period = %(period)s AND owner = %(owner)s
  AND state = 'running'
RETURNING period;

-- name: schedule_run_take_over
-- An operator takes a running fan-out whose owner is gone, at once, audited in the same
-- statement: only while the run is as the operator read it — an owner that renewed, extended,
-- finished or was replaced since leaves it alone (no row).
-- fence: owner, lease_expires_at, renewed_at, state
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
taken AS (
    UPDATE __S__.oncebox_schedule_runs r
    SET owner = %(owner)s, lease_expires_at = clock.now + make_interval(secs => %(lease_s)s),
        started_at = clock.now, renewed_at = clock.now
    FROM clock
    WHERE r.schedule = %(schedule)s AND r.period = %(period)s AND r.state = 'running'
      AND r.owner = %(seen_owner)s AND r.lease_expires_at = %(seen_lease)s::timestamptz
      AND r.renewed_at IS NOT DISTINCT FROM %(seen_renewed)s::timestamptz
    RETURNING r.schedule, r.period, clock.now
),
audited AS (
    INSERT INTO __S__.oncebox_audit
        (at, actor, action, target_kind, target_id, target_key, reason, details)
    SELECT now, %(actor)s, 'take-over', 'schedule', NULL, schedule, %(reason)s,
           jsonb_build_object('period', period, 'owner', %(owner)s::text,
                              'owner_before', %(seen_owner)s::text,
                              'renewed_at_before', %(seen_renewed_text)s::text,
                              'lease_expires_at_before', %(seen_lease_text)s::text)
    FROM taken
    RETURNING id
)
SELECT id AS audit_id FROM audited;

-- name: schedule_run_get
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM __S__.oncebox_schedule_runs
WHERE schedule = %(schedule)s AND period = %(period)s;

-- name: schedule_run_running
-- Every fan-out running now, of every schedule (`status`: who owns each, and whether it is
-- alive); the partial index holds only these.
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM __S__.oncebox_schedule_runs
WHERE state = 'running'
ORDER BY schedule, period;

-- name: schedule_run_finish
-- fence: owner, state
UPDATE __S__.oncebox_schedule_runs
SET state = 'done',
    finished_at = (SELECT __S__.oncebox_now()),
    lease_expires_at = NULL,
    scans = scans + 1,
    eligible_count = %(eligible)s,
    enqueued_count = enqueued_count + %(enqueued)s
WHERE schedule = %(schedule)s AND period = %(period)s AND owner = %(owner)s
  AND state = 'running'
RETURNING period;

-- name: schedule_run_busy
-- Another period of this schedule whose fan-out is still running (a live lease).
SELECT period FROM __S__.oncebox_schedule_runs
WHERE schedule = %(schedule)s AND state = 'running' AND period <> %(period)s
  AND lease_expires_at >= (SELECT __S__.oncebox_now())
LIMIT 1;

-- name: schedule_run_list
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM __S__.oncebox_schedule_runs
WHERE schedule = %(schedule)s
ORDER BY started_at DESC, period DESC
LIMIT %(limit)s;

-- name: schedule_run_stalled
-- Fan-outs interrupted half-way: still `running`, their owner's lease run out. The scheduler
-- resumes them before any catch-up policy applies; oldest first.
SELECT schedule, period, fire_at, state, owner, lease_expires_at, started_at, finished_at,
       scans, eligible_count, enqueued_count, late, renewed_at
FROM __S__.oncebox_schedule_runs
WHERE schedule = %(schedule)s AND state = 'running'
  AND lease_expires_at < (SELECT __S__.oncebox_now())
ORDER BY started_at, period;

-- name: schedule_period_stats
-- Per period of one schedule (the latest periods first): the latest scan's eligible count, what
-- the fan-outs enqueued, and where those jobs and their messages are now, in one pass over the
-- periods' jobs and their messages (oncebox_outbox_job). A job is *covered* when it is done and
-- every message it wrote is sent; *on time* when it was covered within %(window_s)s seconds of
-- the period's fire time (its last message's send, or its completion when it wrote none): the
-- schedule's delivery-window SLO. Without a window (or a fire time: a run by hand), on_time is
-- NULL. A pruned job counts as its run's summary kept it (job_prune).
-- `duplicates`: the possible duplicate sends (resends after an unknown outcome) of its messages
-- still kept (a pruned job's are not summarised).
WITH runs AS (
    SELECT period, state, eligible_count, enqueued_count, fire_at, pruned_done, pruned_sent,
           pruned_on_time, owner, lease_expires_at, renewed_at, started_at
    FROM __S__.oncebox_schedule_runs
    WHERE schedule = %(schedule)s
    ORDER BY period DESC
    LIMIT %(limit)s
),
jobs AS (
    SELECT j.id, j.period, j.state, j.finished_at
    FROM __S__.oncebox_all_jobs j
    WHERE j.schedule = %(schedule)s AND j.period IN (SELECT period FROM runs)
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
    FROM __S__.oncebox_outbox o
    WHERE o.job_id IN (SELECT id FROM jobs) AND o.discarded_at IS NULL
      AND o.channel NOT LIKE '~%%'  -- a broker-held queue's publishes are its jobs' transport
    GROUP BY o.job_id
),
per_period AS (
    SELECT j.period,
           count(*) FILTER (WHERE j.state = 'done') AS done,
           count(*) FILTER (WHERE j.state = 'done' AND COALESCE(m.unsent, 0) = 0) AS covered,
           COALESCE(sum(m.sent), 0) AS sent,
           count(*) FILTER (WHERE j.state IN ('ready', 'leased', 'relayed'))
               + COALESCE(sum(m.pending), 0)
               AS pending,
           count(*) FILTER (WHERE j.state = 'dead') + COALESCE(sum(m.dead), 0) AS dead,
           COALESCE(sum(m.ambiguous), 0) AS ambiguous,
           COALESCE(sum(m.duplicates), 0) AS duplicates,
           count(*) FILTER (WHERE j.state = 'dead' OR COALESCE(m.dead, 0) > 0) AS dead_subjects,
           count(*) FILTER (WHERE j.state <> 'dead' AND COALESCE(m.dead, 0) = 0
                              AND COALESCE(m.ambiguous, 0) > 0) AS held_subjects,
           count(*) FILTER (
               WHERE j.state = 'done' AND COALESCE(m.unsent, 0) = 0
                 AND COALESCE(m.last_sent_at, j.finished_at)
                     <= r.fire_at + make_interval(secs => %(window_s)s::float8)) AS on_time
    FROM jobs j
    JOIN runs r ON r.period = j.period
    LEFT JOIN messages m ON m.job_id = j.id
    GROUP BY j.period
)
SELECT r.period, r.state, r.eligible_count AS eligible, r.enqueued_count AS enqueued,
       -- the jobs pruned count as the run's summary kept them (0011; job_prune)
       COALESCE(p.done, 0) + r.pruned_done AS done,
       COALESCE(p.covered, 0) + r.pruned_done AS covered,
       -- the sums are numeric: as bigint, they read as integers like the counts
       COALESCE(p.sent, 0)::bigint + r.pruned_sent AS sent,
       COALESCE(p.pending, 0)::bigint AS pending,
       COALESCE(p.dead, 0)::bigint AS dead, COALESCE(p.ambiguous, 0)::bigint AS ambiguous,
       r.fire_at,
       COALESCE(p.dead_subjects, 0) AS dead_subjects,
       COALESCE(p.held_subjects, 0) AS held_subjects,
       CASE WHEN %(window_s)s::float8 IS NULL OR r.fire_at IS NULL THEN NULL
            ELSE COALESCE(p.on_time, 0) + r.pruned_on_time END AS on_time,
       COALESCE(p.duplicates, 0)::bigint AS duplicates,
       r.pruned_done AS pruned,
       -- who holds a running fan-out (schedules/owners.py judges whether it is alive)
       CASE WHEN r.state = 'running' THEN r.owner END AS owner,
       CASE WHEN r.state = 'running' THEN r.lease_expires_at END AS lease_expires_at,
       CASE WHEN r.state = 'running' THEN r.renewed_at END AS renewed_at,
       r.started_at
FROM runs r LEFT JOIN per_period p ON p.period = r.period
ORDER BY r.period DESC;

-- name: schedule_run_prune
-- Delete a batch of one schedule's finished runs that finished before the cutoff (the store is
-- given the longer of the retention and the schedule's catch-up window), oldest first, once no
-- job of the period is left: a run is its period's summary, and the jobs still read through it.
-- A finished run with no job of its period left, judged in this statement:
-- fence: state, finished_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
doomed AS (
    SELECT r.schedule, r.period FROM __S__.oncebox_schedule_runs r
    WHERE r.schedule = %(schedule)s AND r.state = 'done'
      AND r.finished_at < (SELECT now FROM clock) - make_interval(secs => %(older_than_s)s)
      AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_all_jobs j
                      WHERE j.schedule = r.schedule AND j.period = r.period)
    ORDER BY r.finished_at, r.period
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
DELETE FROM __S__.oncebox_schedule_runs r USING doomed d
WHERE r.schedule = d.schedule AND r.period = d.period
RETURNING r.period;

-- name: schedule_run_prunable
-- What retention holds of one schedule's runs: when the oldest finished one finished, and how
-- many schedule_run_prune would delete now (up to %(limit)s).
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
SELECT (SELECT min(finished_at) FROM __S__.oncebox_schedule_runs
        WHERE schedule = %(schedule)s AND state = 'done') AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM __S__.oncebox_schedule_runs r
            WHERE %(older_than_s)s::float8 IS NOT NULL
              AND r.schedule = %(schedule)s AND r.state = 'done'
              AND r.finished_at < (SELECT now FROM clock)
                                  - make_interval(secs => %(older_than_s)s::float8)
              AND NOT EXISTS (SELECT 1 FROM __S__.oncebox_all_jobs j
                              WHERE j.schedule = r.schedule AND j.period = r.period)
            LIMIT %(limit)s) w) AS waiting;

-- name: schedule_run_schedules
-- The schedules that have runs (one no longer declared keeps the default policy): a skip scan of
-- the primary key, one probe per schedule, as the runs are kept for ever by default.
WITH RECURSIVE schedules AS (
    (SELECT schedule FROM __S__.oncebox_schedule_runs ORDER BY schedule LIMIT 1)
    UNION ALL
    SELECT (SELECT r.schedule FROM __S__.oncebox_schedule_runs r WHERE r.schedule > s.schedule
            ORDER BY r.schedule LIMIT 1)
    FROM schedules s WHERE s.schedule IS NOT NULL
)
SELECT schedule AS name FROM schedules WHERE schedule IS NOT NULL;
