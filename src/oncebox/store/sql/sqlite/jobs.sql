-- Jobs: enqueue, lease, settle, rescue, replay, read, prune.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: job_insert
INSERT INTO oncebox_jobs
    (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at, created_at,
     trace_context, limit_key)
SELECT :key, :task, :queue, :args, :priority, :group_key, :max_attempts,
       COALESCE(:run_at, :now + :delay_us), :now + :max_age_us, :now, :trace_context, :limit_key
WHERE :key IS NULL OR NOT EXISTS (SELECT 1 FROM oncebox_intents i WHERE i.key = :key)
ON CONFLICT (key) WHERE state <> 'cancelled' DO NOTHING
RETURNING id, state;

-- name: job_insert_many
-- :rows is a JSON array of [key, args_json_text, group_key, limit_key].
INSERT INTO oncebox_jobs
    (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at, created_at,
     schedule, period, trace_context, limit_key)
SELECT r.value ->> 0, :task, :queue, r.value ->> 1, :priority, r.value ->> 2, :max_attempts,
       COALESCE(:run_at, :now + :delay_us), :now + :max_age_us, :now, :schedule, :period,
       :trace_context, r.value ->> 3
FROM json_each(:rows) AS r
WHERE r.value ->> 0 IS NULL
   OR NOT EXISTS (SELECT 1 FROM oncebox_intents i WHERE i.key = r.value ->> 0)
ON CONFLICT (key) WHERE state <> 'cancelled' DO NOTHING
RETURNING id, key;

-- name: job_merge
-- See the PostgreSQL statement; counted by job_merge__count.
-- fence: debounce_key, state
UPDATE oncebox_jobs AS j
SET args = CASE WHEN :keep_last THEN :args ELSE j.args END,
    key = CASE WHEN :keep_last THEN :key ELSE j.key END,
    group_key = CASE WHEN :keep_last THEN :group_key ELSE j.group_key END,
    limit_key = CASE WHEN :keep_last THEN :limit_key ELSE j.limit_key END,
    run_at = CASE WHEN :throttle THEN j.run_at
                  ELSE min(:now + :window_us, COALESCE(j.created_at + :max_wait_us,
                                                       :now + :window_us)) END
WHERE j.debounce_key = :debounce_key AND j.state = 'ready'
  AND (NOT :keep_last OR :key IS NULL OR j.key = :key
       OR (NOT EXISTS (SELECT 1 FROM oncebox_jobs o WHERE o.key = :key AND o.state <> 'cancelled')
           AND NOT EXISTS (SELECT 1 FROM oncebox_intents i WHERE i.key = :key)))
RETURNING id, key;

-- name: job_insert_collapsed
-- See the PostgreSQL statement; the throttle's row is written by job_insert_collapsed__throttle
-- and the count by job_insert__count.
-- no fence: the throttle's time is written only with the pending job it times, which one enqueue
--   inserts (the unique debounce index)
INSERT INTO oncebox_jobs
    (key, task, queue, args, priority, group_key, max_attempts, run_at, expires_at, created_at,
     trace_context, limit_key, debounce_key)
SELECT :key, :task, :queue, :args, :priority, :group_key, :max_attempts,
       CASE WHEN :throttle
            THEN max(:now, COALESCE((SELECT l.updated_at FROM oncebox_limits l
                                     WHERE l.name = '~throttle' AND l.partition = :debounce_key)
                                    + :window_us, :now))
            ELSE :now + :window_us END,
       :now + :max_age_us, :now, :trace_context, :limit_key, :debounce_key
WHERE :key IS NULL OR NOT EXISTS (SELECT 1 FROM oncebox_intents i WHERE i.key = :key)
ON CONFLICT DO NOTHING
RETURNING id, state, run_at;

-- name: job_insert_collapsed__throttle
-- no fence: the throttle's time is written only with the pending job it times, which one enqueue
--   inserts (the unique debounce index)
INSERT INTO oncebox_limits AS l (name, partition, updated_at)
VALUES ('~throttle', :debounce_key, :run_at)
ON CONFLICT (name, partition) DO UPDATE SET updated_at = excluded.updated_at;

-- name: job_enqueue_conflict
SELECT j.id AS active_job_id, j.state AS active_state, i.job_id AS intent_job_id,
       i.claimed_at AS intent_claimed_at
FROM (SELECT 1) AS one
LEFT JOIN oncebox_jobs j ON j.key = :key AND j.state <> 'cancelled'
LEFT JOIN oncebox_intents i ON i.key = :key;

-- name: job_lease
-- fence: state, run_at
UPDATE oncebox_jobs
SET state = 'leased',
    attempt = attempt + 1,
    leased_by = :worker,
    leased_at = :now,
    lease_token = :token,
    lease_expires_at = :now + :lease_us,
    debounce_key = NULL
WHERE id IN (
    SELECT j.id
    FROM oncebox_jobs j
    WHERE j.state = 'ready' AND j.limit_key IS NULL  -- limited jobs: job_lease_limited
      AND j.run_at <= :now
      -- the unary plus keeps oncebox_jobs_task_due out of the plan: the claim index's order
      -- is the lease's order, where the task's index would sort every ready job of the task
      AND +j.task IN (SELECT value FROM json_each(:tasks))
      AND j.queue IN (SELECT value FROM json_each(:queues))
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM oncebox_jobs g
            WHERE g.group_key = j.group_key AND g.queue = j.queue
              AND g.state IN ('ready', 'leased') AND g.id <> j.id
              AND (g.state = 'leased' OR g.id < j.id)))
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT :limit)
RETURNING id, key, task, args AS args_json, attempt, max_attempts, attempt_base, priority,
          run_at, expires_at, leased_at, trace_context;

-- name: job_unlimit
-- See the PostgreSQL statement: only for a task no process has declared limited within
-- :within_us (limit_declare).
-- fence: state, limit_key, declared_at
UPDATE oncebox_jobs
SET limit_key = NULL
WHERE id IN (
    SELECT id FROM oncebox_jobs
    WHERE state = 'ready' AND limit_key IS NOT NULL
      AND task IN (
          SELECT t.value FROM json_each(:tasks) AS t
          WHERE NOT EXISTS (
              SELECT 1 FROM oncebox_limit_declarations d
              WHERE d.task = t.value AND d.declared_at > :now - :within_us))
    LIMIT :limit);

-- name: job_limited_partitions
-- See the PostgreSQL query: a skip scan of oncebox_jobs_limited, with the partitions' buckets.
WITH RECURSIVE parts(task, part) AS (
    SELECT t.value, (SELECT min(j.limit_key) FROM oncebox_jobs j
                     WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.task = t.value)
    FROM json_each(:tasks) AS t
    UNION ALL
    SELECT p.task, (SELECT min(j.limit_key) FROM oncebox_jobs j
                    WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.task = p.task
                      AND j.limit_key > p.part)
    FROM parts p
    WHERE p.part IS NOT NULL
)
SELECT p.task, p.part AS partition, b.name, b.tokens, b.updated_at
FROM parts p
LEFT JOIN oncebox_limits b
       ON b.name IN (SELECT value FROM json_each(:rates)) AND b.partition = p.part
      AND p.part <> ''
WHERE p.part IS NOT NULL
ORDER BY 1, 2;

-- name: job_limited_leased
SELECT task, limit_key AS partition, count(*) AS leased
FROM oncebox_jobs
WHERE state = 'leased' AND limit_key IS NOT NULL
  AND task IN (SELECT value FROM json_each(:counted))
GROUP BY 1, 2;

-- name: job_limited_next_due
-- See the PostgreSQL query: each task's first entry of oncebox_jobs_task_due past now.
SELECT t.value AS task,
       (SELECT j.run_at FROM oncebox_jobs j
        WHERE j.state = 'ready' AND j.task = t.value AND j.run_at > :now
        ORDER BY j.task, j.run_at LIMIT 1) AS at
FROM json_each(:tasks) t;

-- name: job_limited_waiting
-- See the PostgreSQL query.
WITH RECURSIVE parts(task, part) AS (
    SELECT t.value, (SELECT min(j.limit_key) FROM oncebox_jobs j
                     WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.task = t.value)
    FROM json_each(:tasks) AS t
    UNION ALL
    SELECT p.task, (SELECT min(j.limit_key) FROM oncebox_jobs j
                    WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.task = p.task
                      AND j.limit_key > p.part)
    FROM parts p
    WHERE p.part IS NOT NULL
),
listed AS (SELECT task, part FROM parts WHERE part IS NOT NULL LIMIT :partitions)
SELECT l.task, l.part AS partition,
       (SELECT count(*) FROM (SELECT 1 FROM oncebox_jobs j
                              WHERE j.state = 'ready' AND j.task = l.task
                                AND j.limit_key = l.part AND j.run_at <= :now
                              LIMIT :cap)) AS waiting,
       (SELECT min(w.run_at) FROM (SELECT j.run_at FROM oncebox_jobs j
                                   WHERE j.state = 'ready' AND j.task = l.task
                                     AND j.limit_key = l.part AND j.run_at <= :now
                                   ORDER BY j.priority DESC, j.run_at, j.id
                                   LIMIT :cap) w) AS oldest
FROM listed l
ORDER BY 1, 2;

-- name: job_limited_candidates
-- One asked partition's: SQLite's LIMIT cannot read a column of an outer row, so the lease asks
-- partition by partition (statements in the same process, a few microseconds each).
SELECT j.task, j.limit_key AS partition, j.id, j.priority, j.run_at
FROM oncebox_jobs j
WHERE j.state = 'ready' AND j.task = :task AND j.limit_key = :partition
  AND j.run_at <= :now
  AND j.queue IN (SELECT value FROM json_each(:queues))
  AND (j.group_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM oncebox_jobs g
        WHERE g.group_key = j.group_key AND g.queue = j.queue
          AND g.state IN ('ready', 'leased') AND g.id <> j.id
          AND (g.state = 'leased' OR g.id < j.id)))
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT :n;

-- name: job_lease_limited
-- See the PostgreSQL statement (:picks: [id, partition]); under the write lock nothing can
-- have changed since the choice, so the checks only say what the choice relied on.
-- fence: state, limit_key, run_at
UPDATE oncebox_jobs
SET state = 'leased',
    attempt = attempt + 1,
    leased_by = :worker,
    leased_at = :now,
    lease_token = :token,
    lease_expires_at = :now + :lease_us,
    debounce_key = NULL
WHERE id IN (
    SELECT j.id FROM json_each(:picks) AS p JOIN oncebox_jobs j ON j.id = p.value ->> 0
    WHERE j.state = 'ready' AND j.limit_key = p.value ->> 1 AND j.run_at <= :now)
RETURNING id, key, task, args AS args_json, attempt, max_attempts, attempt_base, priority,
          run_at, expires_at, leased_at, trace_context;

-- name: job_lease_extend
-- fence: state, lease_token
UPDATE oncebox_jobs
SET lease_expires_at = max(lease_expires_at, :now + :lease_us)
WHERE state = 'leased' AND lease_token IN (SELECT value FROM json_each(:tokens));

-- name: job_release
-- See the PostgreSQL statement. :jobs is a JSON array of [id, the attempt its lease took].
-- fence: lease_token, attempt
UPDATE oncebox_jobs AS j
SET state = 'ready',
    attempt = j.attempt - 1,
    run_at = :now + :delay_us,
    lease_token = NULL,
    lease_expires_at = NULL
FROM json_each(:jobs) AS g
WHERE j.id = g.value ->> 0 AND j.lease_token = :token AND j.attempt = g.value ->> 1
  AND j.state = 'leased'
RETURNING id;

-- name: job_rescue_expired
-- fence: state, lease_expires_at
UPDATE oncebox_jobs
SET state = CASE WHEN attempt - attempt_base >= max_attempts OR expires_at <= :now
                 THEN 'dead' ELSE 'ready' END,
    run_at = :now,
    finished_at = CASE WHEN attempt - attempt_base >= max_attempts OR expires_at <= :now
                       THEN :now END,
    last_error = 'lease expired: ' || COALESCE(leased_by, 'a worker')
        || ' did not finish attempt ' || attempt || ' before its lease ended at '
        || strftime('%Y-%m-%dT%H:%M:%SZ', lease_expires_at / 1000000, 'unixepoch'),
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id IN (
    SELECT id FROM oncebox_jobs
    WHERE state = 'leased' AND lease_expires_at < :now
    ORDER BY lease_expires_at
    LIMIT :limit)
RETURNING id, key, task, state, attempt, leased_by AS worker, leased_at, last_error;

-- name: job_rescue_expired__record
-- :rows is a JSON array of [job_id, attempt, worker, started_at, error].
INSERT INTO oncebox_job_attempts (job_id, attempt, worker, started_at, finished_at, outcome, error)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, :now, 'lease_expired',
       r.value ->> 4
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (job_id, attempt) DO NOTHING;

-- name: job_finish
-- :rows is a JSON array of [id, state, outcome, delay_us, error].
-- fence: lease_token
UPDATE oncebox_jobs AS j
SET state = i.value ->> 1,
    outcome = i.value ->> 2,
    run_at = CASE WHEN i.value ->> 1 = 'ready' THEN :now + (i.value ->> 3) ELSE j.run_at END,
    finished_at = CASE WHEN i.value ->> 1 IN ('done', 'dead') THEN :now END,
    last_error = COALESCE(i.value ->> 4, j.last_error),
    lease_token = NULL,
    lease_expires_at = NULL
FROM json_each(:rows) AS i
WHERE j.id = i.value ->> 0 AND j.lease_token = :token AND j.state = 'leased'
RETURNING id, attempt, leased_by, leased_at, state, last_error;

-- name: job_finish__record
-- :rows is a JSON array of [job_id, attempt, worker, started_at, outcome, error].
INSERT INTO oncebox_job_attempts (job_id, attempt, worker, started_at, finished_at, outcome, error)
SELECT r.value ->> 0, r.value ->> 1, r.value ->> 2, r.value ->> 3, :now, r.value ->> 4,
       r.value ->> 5
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (job_id, attempt) DO NOTHING;

-- name: job_attempt_note
-- no fence: appends a note to an attempt already recorded, which nothing else changes
INSERT INTO oncebox_job_attempts AS a
    (job_id, attempt, worker, started_at, finished_at, outcome, error, note)
VALUES (:job_id, :attempt, :worker, NULL, :now, 'superseded', NULL, :note)
ON CONFLICT (job_id, attempt) DO UPDATE
SET note = COALESCE(a.note || '; ', '') || excluded.note;

-- name: job_replay
-- See the PostgreSQL statement (`if_attempt`: the row as an operator confirmed it).
-- fence: state, if_attempt
UPDATE oncebox_jobs
SET state = 'ready', run_at = :now, attempt_base = attempt, finished_at = NULL
WHERE id = :id AND state = 'dead' AND (:if_attempt IS NULL OR attempt = :if_attempt)
RETURNING id, key, task, attempt;

-- name: job_replay__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'replay', 'job', :id, :key, :reason,
        json_object('task', :task, 'attempts_before', :attempt))
RETURNING id;

-- name: job_cancel
-- fence: state
UPDATE oncebox_jobs
SET state = 'cancelled', finished_at = :now
WHERE id = :id AND state = 'ready'
RETURNING id, key, task;

-- name: job_cancel__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'cancel', 'job', :id, :key, :reason, json_object('task', :task))
RETURNING id;

-- name: job_discard
-- Dead → cancelled, in place, attempts kept, the key free (see the PostgreSQL statement).
-- fence: state, if_attempt
UPDATE oncebox_jobs
SET state = 'cancelled', finished_at = :now
WHERE id = :id AND state = 'dead' AND (:if_attempt IS NULL OR attempt = :if_attempt)
RETURNING id, key, task, attempt;

-- name: job_discard__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'discard', 'job', :id, :key, :reason,
        json_object('task', :task, 'attempts', :attempt))
RETURNING id;

-- name: job_get
SELECT id, key, task, queue, args AS args_json, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM oncebox_jobs WHERE id = :id;

-- name: job_find_by_key
SELECT id, key, task, queue, args AS args_json, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM oncebox_jobs
WHERE (key = :key AND state <> 'cancelled')
   OR id = (SELECT job_id FROM oncebox_intents WHERE key = :key)
ORDER BY id;

-- name: job_attempt_list
SELECT job_id, attempt, worker, started_at, finished_at, outcome, error, note
FROM oncebox_job_attempts WHERE job_id = :id ORDER BY attempt;

-- name: job_count_by_state
-- From the depths the triggers keep (0010), not a count over the table.
SELECT state, outcome, sum(value) AS count
FROM oncebox_depths WHERE kind = 'job'
GROUP BY 1, 2 HAVING sum(value) <> 0;

-- name: job_next_due
-- See the PostgreSQL query: the earliest of each task's first entry in oncebox_jobs_task_due.
SELECT (SELECT min((SELECT j.run_at FROM oncebox_jobs j
                    WHERE j.state = 'ready' AND j.task = t.value
                      AND j.queue IN (SELECT value FROM json_each(:queues))
                    ORDER BY j.task, j.run_at LIMIT 1))
        FROM json_each(:tasks) t) AS at,
       :now AS now;

-- name: job_prune
-- See the PostgreSQL query: the rows come back for the summary (job_prune__summarise), the
-- attempts (job_prune__attempts) and the count (counter_add).
-- fence: state, finished_at
DELETE FROM oncebox_jobs
WHERE id IN (
    SELECT j.id FROM oncebox_jobs j
    WHERE j.state IN ('done', 'cancelled') AND j.task = :task
      AND j.finished_at < :now - :older_than_us
      AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o
                      WHERE o.job_id = j.id AND o.state <> 'sent' AND o.discarded_at IS NULL)
    ORDER BY j.finished_at, j.id
    LIMIT :limit)
RETURNING id, schedule, period, state, finished_at;

-- name: job_prune__summarise
-- :pruned is a JSON array of [id, schedule, period, finished_at] of the done jobs pruned (their
-- messages are still there); windows in seconds, instants in microseconds.
-- no fence: adds the jobs job_prune deleted in this transaction to their runs' summaries
--   (increments)
WITH doomed AS (
    SELECT value ->> 0 AS id, value ->> 1 AS schedule, value ->> 2 AS period,
           value ->> 3 AS finished_at
    FROM json_each(:pruned)
),
counted AS (
    SELECT d.schedule, d.period, count(*) AS done, COALESCE(sum(m.sent), 0) AS sent,
           count(*) FILTER (
               WHERE COALESCE(m.last_sent_at, d.finished_at)
                     <= run.fire_at + CAST(COALESCE(run.pruned_window_s, sch.slo_window_s)
                                           * 1000000 AS INTEGER)) AS on_time,
           COALESCE(run.pruned_window_s, sch.slo_window_s) AS window_s
    FROM doomed d
    JOIN oncebox_schedule_runs run ON run.schedule = d.schedule AND run.period = d.period
    LEFT JOIN oncebox_schedules sch ON sch.name = d.schedule
    LEFT JOIN (
        SELECT o.job_id, count(*) AS sent, max(o.sent_at) AS last_sent_at
        FROM oncebox_outbox o
        WHERE o.job_id IN (SELECT id FROM doomed) AND o.discarded_at IS NULL
        GROUP BY o.job_id
    ) m ON m.job_id = d.id
    GROUP BY d.schedule, d.period
)
UPDATE oncebox_schedule_runs AS r
SET pruned_done = r.pruned_done + c.done,
    pruned_sent = r.pruned_sent + c.sent,
    pruned_on_time = r.pruned_on_time + c.on_time,
    pruned_window_s = c.window_s
FROM counted c
WHERE r.schedule = c.schedule AND r.period = c.period;

-- name: job_prune__attempts
-- no fence: the attempts of the jobs job_prune deleted in this transaction
DELETE FROM oncebox_job_attempts WHERE job_id IN (SELECT value FROM json_each(:ids));

-- name: job_prunable
-- See the PostgreSQL query.
SELECT (SELECT min(finished_at) FROM oncebox_jobs
        WHERE state IN ('done', 'cancelled') AND task = :task) AS oldest,
       (SELECT count(*) FROM (
            SELECT 1 FROM oncebox_jobs j
            WHERE :older_than_us IS NOT NULL
              AND j.state IN ('done', 'cancelled') AND j.task = :task
              AND j.finished_at < :now - :older_than_us
              AND NOT EXISTS (SELECT 1 FROM oncebox_outbox o
                              WHERE o.job_id = j.id AND o.state <> 'sent'
                                AND o.discarded_at IS NULL)
            LIMIT :limit)) AS waiting;

-- name: job_list
-- See the PostgreSQL statement. lower() folds ASCII letters only here (SQLite without ICU).
SELECT id, key, task, queue, args AS args_json, state, outcome, priority, group_key, attempt,
       max_attempts, attempt_base, run_at, expires_at, created_at, leased_by, leased_at,
       lease_expires_at, finished_at, last_error, schedule, period
FROM oncebox_jobs
WHERE (:state IS NULL OR state = :state)
  AND (:task IS NULL OR task = :task)
  AND (:queue IS NULL OR queue = :queue)
  AND (:schedule IS NULL OR schedule = :schedule)
  AND (:period IS NULL OR period = :period)
  AND (:error IS NULL OR instr(lower(last_error), lower(:error)) > 0)
  AND (:older_than_us IS NULL OR finished_at <= :now - :older_than_us)
  AND (:newer_than_us IS NULL OR finished_at > :now - :newer_than_us)
  AND (:before_id IS NULL OR id < :before_id)
  AND (:key_prefix IS NULL
       OR (key >= :key_prefix AND key < :key_upper AND state <> 'cancelled'))
ORDER BY id DESC
LIMIT :limit;
