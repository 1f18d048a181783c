-- The history of finished jobs (issue 47, docs/architecture.md "Storage"): a job done or
-- cancelled leaves the jobs table, in the statement that settles it, for a row of
-- oncebox_job_history, partitioned by the week it finished in (Monday 00:00 UTC), which
-- retention drops whole. The jobs table keeps what waits, runs or is held — ready, leased,
-- relayed (a broker holds it) and dead (it waits for an operator: replayed in place, under its
-- key, which no other job can take meanwhile) — so its indexes stay the size of the work.
-- * What every read of a job names is the view oncebox_all_jobs: both tables, one row per job.
-- * A key: the jobs table's unique index holds it while its job waits, runs or is dead; once
--   done, the key's intent (claimed in the same transaction) holds it. An enqueue whose check
--   of the intents read a snapshot from before a completion committed, and whose insert met the
--   completed job's row being moved, is accepted: its job's claim then meets the intent, and it
--   finishes as a duplicate without running its handler (docs/guarantees.md).
-- * The weeks: oncebox_job_history_weeks(from, to) makes the partitions of the weeks from..to
--   that do not exist yet (the pruner keeps four weeks ahead); a row that finds no week of its
--   own (none made in time) lands in the default partition, from which making its week moves
--   it. A week is made under a lock timeout: attaching it locks the default partition, so it
--   waits for no long read of the history, and a pruner pass that gives up tries again later.
-- * Finished jobs already in the jobs table stay there until moved in batches
--   (job_history_move, by the pruner or `oncebox migrate --move-history`); until then every read
--   sees each job once, wherever it is.

CREATE TABLE __S__.oncebox_job_history (
    id bigint NOT NULL,
    key text COLLATE "C",
    task text NOT NULL,
    queue text COLLATE "C" NOT NULL,
    args jsonb NOT NULL,
    state text NOT NULL CHECK (state IN ('done', 'cancelled')),
    outcome text CHECK (outcome IN ('completed', 'duplicate')),
    priority integer NOT NULL,
    group_key text COLLATE "C",
    attempt integer NOT NULL,
    max_attempts integer NOT NULL,
    attempt_base integer NOT NULL,
    run_at timestamptz NOT NULL,
    expires_at timestamptz,
    created_at timestamptz NOT NULL,
    leased_by text,
    leased_at timestamptz,
    finished_at timestamptz NOT NULL,
    last_error text,
    schedule text,
    period text,
    trace_context text,
    limit_key text,
    CHECK ((outcome IS NOT NULL) = (state = 'done'))
) PARTITION BY RANGE (finished_at);
CREATE TABLE __S__.oncebox_job_history_default PARTITION OF __S__.oncebox_job_history DEFAULT;

-- a job by id (its intent, an audit entry, a message name it), by key, by task in finishing
-- order (retention, listings), and a period's jobs
CREATE INDEX oncebox_job_history_id ON __S__.oncebox_job_history (id);
CREATE INDEX oncebox_job_history_key ON __S__.oncebox_job_history (key) WHERE key IS NOT NULL;
CREATE INDEX oncebox_job_history_finished ON __S__.oncebox_job_history (task, finished_at, id);
CREATE INDEX oncebox_job_history_schedule_period ON __S__.oncebox_job_history (schedule, period)
    WHERE schedule IS NOT NULL;

CREATE TRIGGER oncebox_job_history_depth_insert AFTER INSERT ON __S__.oncebox_job_history
    REFERENCING NEW TABLE AS depth_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_depth();
CREATE TRIGGER oncebox_job_history_depth_delete AFTER DELETE ON __S__.oncebox_job_history
    REFERENCING OLD TABLE AS depth_old
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_depth();

CREATE FUNCTION __S__.oncebox_job_history_weeks(from_at timestamptz, to_at timestamptz)
RETURNS integer LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    week timestamp := date_trunc('week', from_at AT TIME ZONE 'UTC');  -- Monday, UTC
    made integer := 0;
    part text;
    ns text := (SELECT relnamespace::regnamespace::text FROM pg_class
                WHERE oid = '__S__.oncebox_job_history'::regclass);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('__S__.oncebox_job_history_weeks', 1604));
    WHILE week <= to_at AT TIME ZONE 'UTC' LOOP
        part := 'oncebox_job_history_' || to_char(week, 'YYYYMMDD');
        IF to_regclass(format('%s.%I', ns, part)) IS NULL THEN
            EXECUTE format('CREATE TABLE %s.%I (LIKE %s.oncebox_job_history '
                           'INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', ns, part, ns);
            EXECUTE format('WITH moved AS (DELETE FROM %s.oncebox_job_history_default '
                           'WHERE finished_at >= $1 AND finished_at < $2 RETURNING *) '
                           'INSERT INTO %s.%I SELECT * FROM moved', ns, ns, part)
                USING week AT TIME ZONE 'UTC', (week + interval '7 days') AT TIME ZONE 'UTC';
            EXECUTE format('ALTER TABLE %s.oncebox_job_history ATTACH PARTITION %s.%I '
                           'FOR VALUES FROM (%L) TO (%L)', ns, ns, part,
                           week AT TIME ZONE 'UTC', (week + interval '7 days') AT TIME ZONE 'UTC');
            made := made + 1;
        END IF;
        week := week + interval '7 days';
    END LOOP;
    RETURN made;
END
$$;

-- Whether a week of the history must stay (oncebox_job_history_drop): a task with jobs in it
-- kept for ever or not yet past its retention since the week ended (`ends`), or a job of it
-- with a message still to send.
CREATE FUNCTION __S__.oncebox_job_history_held(
    ns text, part text, keep jsonb, default_s float8, ends timestamptz
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    held boolean;
BEGIN
    -- each task of the week, one probe each (a skip scan of its finishing-order index)
    EXECUTE format($q$
        WITH RECURSIVE tasks(task) AS (
            SELECT min(task) FROM %1$s.%2$I
            UNION ALL
            SELECT (SELECT min(t.task) FROM %1$s.%2$I t WHERE t.task > tasks.task)
            FROM tasks WHERE tasks.task IS NOT NULL
        )
        SELECT EXISTS (
            SELECT 1 FROM tasks,
                 LATERAL (SELECT CASE WHEN $1 ? tasks.task THEN ($1 ->> tasks.task)::float8
                                      ELSE $2 END AS s) k
            WHERE tasks.task IS NOT NULL
              AND (k.s IS NULL OR $3 + make_interval(secs => k.s) > __S__.oncebox_now()))
    $q$, ns, part) INTO held USING keep, default_s, ends;
    IF held THEN
        RETURN true;
    END IF;
    -- the messages still to send, through the outbox's index for each such state (few, where
    -- the week's jobs are many), each probed in the week
    EXECUTE format($q$
        SELECT EXISTS (
            SELECT 1
            FROM (SELECT job_id FROM __S__.oncebox_outbox
                  WHERE state = 'pending' AND discarded_at IS NULL
                  UNION ALL
                  SELECT job_id FROM __S__.oncebox_outbox
                  WHERE state IN ('leased', 'sending') AND discarded_at IS NULL
                  UNION ALL
                  SELECT job_id FROM __S__.oncebox_outbox
                  WHERE state IN ('dead', 'ambiguous') AND discarded_at IS NULL) u
            WHERE EXISTS (SELECT 1 FROM %1$s.%2$I j WHERE j.id = u.job_id))
    $q$, ns, part) INTO held;
    RETURN held;
END
$$;

-- A week of the history goes whole (the pruner, `job_history_drop`): the oldest week that ended
-- and whose every task with jobs in it is past its retention (keep: {task: seconds, or null for
-- ever}; a task not named keeps default_s; NULL: for ever), none of its jobs having a message
-- still to send (a week a task keeps for ever stays, and the weeks after it go). What its jobs
-- counted is folded first, as job_prune folds a batch's: each done job of a schedule period
-- into its run's summary, the depths, the pruned_jobs counter; their failed attempts go with
-- them. The week is locked against writers first (a pruner's batch, a re-opened job), not
-- readers; the drop then waits at most the function's lock timeout for the history itself.
-- Returns the week dropped and its jobs, or no row.
CREATE FUNCTION __S__.oncebox_job_history_drop(keep jsonb, default_s float8)
RETURNS TABLE (week text, jobs bigint) LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    ns text := (SELECT relnamespace::regnamespace::text FROM pg_class
                WHERE oid = '__S__.oncebox_job_history'::regclass);
    part text;
    ends timestamptz;
    n bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('__S__.oncebox_job_history_weeks', 1604));
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = '__S__.oncebox_job_history'::regclass AND c.relname ~ '_[0-9]{8}$'
        ORDER BY c.relname
    LOOP
        ends := (to_date(right(part, 8), 'YYYYMMDD') + 7)::timestamp AT TIME ZONE 'UTC';
        EXIT WHEN ends > __S__.oncebox_now();
        -- judged before the lock (a week a task keeps costs no lock), and again under it
        CONTINUE WHEN __S__.oncebox_job_history_held(ns, part, keep, default_s, ends);
        EXECUTE format('LOCK TABLE %s.%I IN SHARE ROW EXCLUSIVE MODE', ns, part);
        CONTINUE WHEN __S__.oncebox_job_history_held(ns, part, keep, default_s, ends);
        EXECUTE format($q$
            WITH doomed AS MATERIALIZED (
                SELECT id, task, queue, state, outcome, schedule, period, finished_at
                FROM %1$s.%2$I
            ),
            counted AS (  -- as job_prune counts
                SELECT d.schedule, d.period, count(*) AS done, COALESCE(sum(m.sent), 0) AS sent,
                       count(*) FILTER (
                           WHERE COALESCE(m.last_sent_at, d.finished_at)
                                 <= run.fire_at + make_interval(secs => w.window_s)) AS on_time,
                       w.window_s
                FROM doomed d
                JOIN __S__.oncebox_schedule_runs run
                    ON run.schedule = d.schedule AND run.period = d.period
                LEFT JOIN __S__.oncebox_schedules sch ON sch.name = d.schedule
                CROSS JOIN LATERAL (SELECT COALESCE(run.pruned_window_s, sch.slo_window_s)
                                           AS window_s) w
                LEFT JOIN LATERAL (
                    SELECT count(*) AS sent, max(o.sent_at) AS last_sent_at
                    FROM __S__.oncebox_outbox o
                    WHERE o.job_id = d.id AND o.discarded_at IS NULL
                ) m ON true
                WHERE d.state = 'done' AND d.schedule IS NOT NULL
                GROUP BY d.schedule, d.period, w.window_s
            ),
            summarised AS (
                UPDATE __S__.oncebox_schedule_runs r
                SET pruned_done = r.pruned_done + c.done,
                    pruned_sent = r.pruned_sent + c.sent,
                    pruned_on_time = r.pruned_on_time + c.on_time,
                    pruned_window_s = c.window_s
                FROM counted c
                WHERE r.schedule = c.schedule AND r.period = c.period
            ),
            depths AS (  -- what the depth trigger would have taken off, had the rows been deleted
                INSERT INTO __S__.oncebox_depths AS d
                    (kind, name, queue, state, outcome, shard, value)
                SELECT 'job', task, queue, state, COALESCE(outcome, ''), pg_backend_pid(), -count(*)
                FROM doomed
                GROUP BY 2, 3, 4, 5
                ORDER BY 2, 3, 4, 5
                ON CONFLICT (kind, name, queue, state, outcome, shard)
                DO UPDATE SET value = d.value + excluded.value
            ),
            pruned AS (
                INSERT INTO __S__.oncebox_counters AS c (name, shard, value)
                SELECT 'pruned_jobs', pg_backend_pid(), count(*) FROM doomed HAVING count(*) > 0
                ON CONFLICT (name, shard) DO UPDATE SET value = c.value + excluded.value
            ),
            attempts AS (
                DELETE FROM __S__.oncebox_job_attempts a WHERE a.job_id IN (SELECT id FROM doomed)
            )
            SELECT count(*) FROM doomed
        $q$, ns, part) INTO n;
        EXECUTE format('DROP TABLE %s.%I', ns, part);
        week := part;
        jobs := n;
        RETURN NEXT;
        RETURN;  -- a week a call: the pruner's next pass takes the next one
    END LOOP;
END
$$;

SELECT __S__.oncebox_job_history_weeks(
    LEAST(__S__.oncebox_now(),
          (SELECT min(finished_at) FROM __S__.oncebox_jobs WHERE stage IN ('done', 'cancelled'))),
    __S__.oncebox_now() + interval '28 days');

-- (`stage` too, so a filter on it reaches the jobs table's indexes; a finished job's is its state)
CREATE VIEW __S__.oncebox_all_jobs AS
SELECT id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
       attempt_base, run_at, expires_at, created_at, leased_by, leased_at, lease_token,
       lease_expires_at, finished_at, last_error, schedule, period, trace_context, limit_key,
       debounce_key, stage
FROM __S__.oncebox_jobs
UNION ALL
SELECT id, key, task, queue, args, state, outcome, priority, group_key, attempt, max_attempts,
       attempt_base, run_at, expires_at, created_at, leased_by, leased_at, NULL::uuid,
       NULL::timestamptz, finished_at, last_error, schedule, period, trace_context, limit_key,
       NULL::text, state
FROM __S__.oncebox_job_history;

-- The relay (0016, 0023) learns that a job left: a head moved to the history ends as a head
-- that turned dead does. Its two reads of a group's waiting, running and broker-held jobs name
-- `stage`, so they read oncebox_jobs_group (0024).
CREATE OR REPLACE FUNCTION __S__.oncebox_jobs_relay() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    due bigint[];  -- the jobs whose next attempt is to be published now, if their turn has come
    retried bigint[];  -- heads at a new attempt: published now
BEGIN
    -- each branch names only the transition tables its operation has (see oncebox_jobs_depth);
    -- the jobs table read here already holds the statement's own rows
    IF TG_OP = 'INSERT' THEN
        IF NOT EXISTS (SELECT 1 FROM relay_new WHERE state = 'relayed') THEN
            RETURN NULL;  -- a table queue's insert: no outbox statement (nor its NOTIFY)
        END IF;
        PERFORM pg_advisory_xact_lock(g.lock)
        FROM (SELECT DISTINCT hashtextextended(queue || chr(1) || group_key, 1604) AS lock
              FROM relay_new WHERE state = 'relayed' AND group_key IS NOT NULL) g
        ORDER BY g.lock;
        SELECT array_agg(n.id) INTO due FROM relay_new n WHERE n.state = 'relayed';
    ELSIF TG_OP = 'DELETE' THEN
        -- a job that left the table for the history (done, cancelled: 0025) ends its group's
        -- head, or frees the group of a broker-held queue whose head it was to become
        IF NOT EXISTS (SELECT 1 FROM relay_old
                       WHERE group_key IS NOT NULL AND state IN ('ready', 'relayed'))
        THEN
            -- a table queue's settlement (its jobs are leased, never relayed) or the move of
            -- finished jobs: no broker-held group to move on, no lock taken
            RETURN NULL;
        END IF;
        PERFORM pg_advisory_xact_lock(g.lock)
        FROM (SELECT DISTINCT hashtextextended(queue || chr(1) || group_key, 1604) AS lock
              FROM relay_old
              WHERE group_key IS NOT NULL AND state IN ('ready', 'relayed')) g
        ORDER BY g.lock;
        SELECT array_agg(h.id) INTO due
        FROM (SELECT DISTINCT queue, group_key FROM relay_old
              WHERE group_key IS NOT NULL AND state IN ('ready', 'relayed')) f,
             LATERAL (SELECT g.id, g.state FROM __S__.oncebox_jobs g
                      WHERE g.queue = f.queue AND g.group_key = f.group_key
                        AND g.stage IN ('ready', 'relayed')
                      ORDER BY g.id LIMIT 1) h
        WHERE h.state = 'relayed';
    ELSE
        IF NOT EXISTS (SELECT 1 FROM relay_new
                       WHERE state = 'relayed' OR (state = 'cancelled' AND group_key IS NOT NULL))
           AND NOT EXISTS (SELECT 1 FROM relay_old WHERE state = 'relayed') THEN
            -- a table queue's statement: no relayed job among them, and no cancel that could
            -- free a broker-held group's head (a ready one, not yet handed to the relay)
            RETURN NULL;
        END IF;
        PERFORM pg_advisory_xact_lock(g.lock)
        FROM (SELECT DISTINCT hashtextextended(queue || chr(1) || group_key, 1604) AS lock
              FROM relay_new WHERE group_key IS NOT NULL) g
        ORDER BY g.lock;
        WITH changed AS (
            SELECT n.id, n.queue, n.group_key, n.state, o.state AS was,
                   n.attempt <> o.attempt AS next_attempt
            FROM relay_new n JOIN relay_old o ON o.id = n.id
        )
        SELECT array_agg(id) INTO due FROM (
            -- relayed now (a replay, an adoption): publish its attempt when its turn comes
            SELECT id FROM changed WHERE state = 'relayed' AND was <> 'relayed'
            UNION
            -- a group's head ended: its next job is the head now
            SELECT h.id
            FROM (SELECT DISTINCT queue, group_key FROM changed
                  WHERE group_key IS NOT NULL AND was IN ('ready', 'leased', 'relayed')
                    AND state NOT IN ('ready', 'leased', 'relayed')) f,
                 LATERAL (SELECT g.id, g.state FROM __S__.oncebox_jobs g
                          WHERE g.queue = f.queue AND g.group_key = f.group_key
                            AND g.stage IN ('ready', 'relayed')
                          ORDER BY g.id LIMIT 1) h
            WHERE h.state = 'relayed'
        ) d;
        -- relayed at a new attempt: delivered, so the head (or in no group)
        SELECT array_agg(n.id) INTO retried
        FROM relay_new n JOIN relay_old o ON o.id = n.id
        WHERE n.state = 'relayed' AND o.state = 'relayed' AND n.attempt <> o.attempt;
    END IF;
    -- a job of a group waits while an earlier job of its group waits or runs, and while
    -- another job of its group is the head: relayed with its attempt's publish written, so
    -- decided under this lock before, whatever its id (an id is taken at insert, the decision
    -- when the statement ends: a long batch's job may be decided after a later one's)
    SELECT array_agg(j.id ORDER BY j.id) INTO due
    FROM __S__.oncebox_jobs j
    WHERE j.id = ANY(due) AND j.state = 'relayed'
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM __S__.oncebox_jobs g
            WHERE g.queue = j.queue AND g.group_key = j.group_key AND g.id < j.id
              AND g.stage IN ('ready', 'relayed')))
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM __S__.oncebox_jobs g
            JOIN __S__.oncebox_outbox o ON o.key = '~relay/' || g.id || '/' || (g.attempt + 1)
            WHERE g.queue = j.queue AND g.group_key = j.group_key AND g.id <> j.id
              AND g.state = 'relayed'));
    due := due || retried;
    IF due IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO __S__.oncebox_outbox
        (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at,
         trace_context)
    SELECT '~relay/' || j.id || '/' || (j.attempt + 1), '~relay/' || j.id,
           '~broker.' || j.queue,
           jsonb_build_object('job', j.id, 'run', j.attempt + 1, 'task', j.task, 'args', j.args)
               || CASE WHEN j.group_key IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('group', j.group_key) END,
           'relay-' || j.id || '-' || (j.attempt + 1), j.id, j.run_at,
           (SELECT __S__.oncebox_now()), j.trace_context
    FROM __S__.oncebox_jobs j
    WHERE j.id = ANY(due)
    ORDER BY j.id
    ON CONFLICT (key) DO NOTHING;
    RETURN NULL;
END
$$;


CREATE TRIGGER oncebox_jobs_relay_delete AFTER DELETE ON __S__.oncebox_jobs
    REFERENCING OLD TABLE AS relay_old
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_relay();
