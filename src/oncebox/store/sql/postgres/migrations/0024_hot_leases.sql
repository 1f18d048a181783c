-- A lease that rewrites no index entry (issue 47, docs/architecture.md "Storage").
--
-- PostgreSQL updates a row in place on its page (a HOT update: no new index entry anywhere)
-- only when no column any index of the table names — as a key or in its predicate — changed
-- value. Every index of the jobs table named `state`, and the lease changes `state`, so every
-- lease wrote a new entry into each of the table's indexes (bench/storage.py: none of the
-- jobs table's updates was HOT). So:
-- * `stage`: the state with a lease counted as ready — what the indexes select on instead of
--   `state`. A lease (ready -> leased) and a heartbeat leave it, and every indexed column,
--   unchanged; a lease's readers still test `state = 'ready'`, on the row. The claim, due and
--   group indexes hold leased rows too (at most a batch per consumer lane, at the front of the
--   claim order), which the lease steps over.
-- * `slot`: a leased limited job's partition, NULL otherwise: the slots in use of a concurrency
--   limit, counted through oncebox_jobs_slots. An unlimited job's lease leaves it NULL, so only
--   a limited job's lease is not HOT.
-- * oncebox_job_leases: one row per lease (the batch one statement took under one token), with
--   the ids it took and its deadline. The rescuer finds run-out leases here, through the
--   deadline index the jobs table can no longer have; a heartbeat moves a lease's deadline here
--   and on its rows; the statement that settles or gives back a lease's last held job deletes its
--   row (a lease whose jobs all left another way, by the rescuer).
-- * fillfactor 40: room on every page for each row's leased version (wider: worker, token, times)
--   beside its waiting one.
--
-- The generated columns rewrite the table (as a VACUUM FULL would) under this migration's lock:
-- 23 s for a million jobs on the 2-core development machine; on a large table run it in a quiet
-- window (docs/deploy.md, "Upgrading").

ALTER TABLE __S__.oncebox_jobs
    ADD COLUMN stage text COLLATE "C" NOT NULL
        GENERATED ALWAYS AS (CASE WHEN state = 'leased' THEN 'ready' ELSE state END) STORED,
    ADD COLUMN slot text COLLATE "C"
        GENERATED ALWAYS AS (CASE WHEN state = 'leased' THEN limit_key END) STORED;
ALTER TABLE __S__.oncebox_jobs SET (fillfactor = 40);

DROP INDEX __S__.oncebox_jobs_claim;
DROP INDEX __S__.oncebox_jobs_due;
DROP INDEX __S__.oncebox_jobs_task_due;
DROP INDEX __S__.oncebox_jobs_leased;
DROP INDEX __S__.oncebox_jobs_group;
DROP INDEX __S__.oncebox_jobs_group_active;
DROP INDEX __S__.oncebox_jobs_limited;
DROP INDEX __S__.oncebox_jobs_limited_leased;
DROP INDEX __S__.oncebox_jobs_debounce;
DROP INDEX __S__.oncebox_jobs_dead;
DROP INDEX __S__.oncebox_jobs_finished;
DROP INDEX __S__.oncebox_jobs_one_per_key;

CREATE UNIQUE INDEX oncebox_jobs_one_per_key ON __S__.oncebox_jobs (key)
    WHERE stage <> 'cancelled';
CREATE INDEX oncebox_jobs_claim ON __S__.oncebox_jobs (priority DESC, run_at, id)
    WHERE stage = 'ready' AND limit_key IS NULL;
CREATE INDEX oncebox_jobs_task_due ON __S__.oncebox_jobs (task, run_at) WHERE stage = 'ready';
-- a group's waiting, running and broker-held jobs (0016: the relay's group decisions read the
-- relayed ones; the lease's head check filters them out on the row)
CREATE INDEX oncebox_jobs_group ON __S__.oncebox_jobs (queue, group_key, id)
    WHERE group_key IS NOT NULL AND stage IN ('ready', 'relayed');
CREATE INDEX oncebox_jobs_limited ON __S__.oncebox_jobs
    (task, limit_key, priority DESC, run_at, id)
    WHERE stage = 'ready' AND limit_key IS NOT NULL;
CREATE INDEX oncebox_jobs_slots ON __S__.oncebox_jobs (task, slot) WHERE slot IS NOT NULL;
CREATE UNIQUE INDEX oncebox_jobs_debounce ON __S__.oncebox_jobs (debounce_key)
    WHERE stage = 'ready' AND debounce_key IS NOT NULL;
CREATE INDEX oncebox_jobs_dead ON __S__.oncebox_jobs (id) WHERE stage = 'dead';
CREATE INDEX oncebox_jobs_finished ON __S__.oncebox_jobs (task, finished_at, id)
    WHERE stage IN ('done', 'cancelled');

CREATE TABLE __S__.oncebox_job_leases (
    token uuid PRIMARY KEY,
    worker text NOT NULL,
    expires_at timestamptz NOT NULL,
    ids bigint[] NOT NULL
);
CREATE INDEX oncebox_job_leases_deadline ON __S__.oncebox_job_leases (expires_at);

INSERT INTO __S__.oncebox_job_leases (token, worker, expires_at, ids)
SELECT lease_token, min(leased_by), max(lease_expires_at), array_agg(id ORDER BY id)
FROM __S__.oncebox_jobs WHERE state = 'leased'
GROUP BY lease_token;

-- The relay's group decisions (0023) read a group's jobs through oncebox_jobs_group, whose
-- predicate now names `stage`: the same function, its two reads of a group's waiting, running and
-- broker-held jobs written in `stage`.
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
