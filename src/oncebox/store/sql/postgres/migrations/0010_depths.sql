-- Depths by state (docs/guide.md, "The numbers"): how many jobs of each task and queue, and how
-- many messages of each channel, are in each state — kept by triggers on the two tables, so no
-- statement that moves a row can forget it, and read on every scrape without counting the
-- tables (a count over a 1 000 000-job backlog costs the database ~150 ms; reading this, <1 ms).
-- A statement adds its rows' net change once (statement triggers over transition tables) to
-- the shard of its connection, as the counters do (0008): concurrent writers never wait for
-- one another's row. Readers sum the shards; the pruner folds those of gone connections.
-- A discarded message (0007) counts under the state 'discarded'.
CREATE TABLE __S__.oncebox_depths (
    kind text NOT NULL CHECK (kind IN ('job', 'message')),
    name text NOT NULL,      -- a job's task, a message's channel
    queue text NOT NULL,     -- a job's queue; '' for a message
    state text NOT NULL,
    outcome text NOT NULL,   -- a done job's outcome; '' otherwise
    shard integer NOT NULL,
    value bigint NOT NULL,
    PRIMARY KEY (kind, name, queue, state, outcome, shard)
) WITH (fillfactor = 50);

CREATE FUNCTION __S__.oncebox_jobs_depth() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- each branch names only the transition tables its operation has (plpgsql plans a
    -- statement when it first runs it)
    IF TG_OP = 'INSERT' THEN
        INSERT INTO __S__.oncebox_depths AS d
            (kind, name, queue, state, outcome, shard, value)
        SELECT 'job', c.name, c.queue, c.state, c.outcome, pg_backend_pid(), sum(c.delta)
        FROM (
            SELECT task, queue, state,
                   COALESCE(outcome, ''), 1 FROM depth_new
        ) AS c(name, queue, state, outcome, delta)
        GROUP BY 2, 3, 4, 5
        HAVING sum(c.delta) <> 0
        ORDER BY 2, 3, 4, 5
        ON CONFLICT (kind, name, queue, state, outcome, shard)
        DO UPDATE SET value = d.value + excluded.value;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO __S__.oncebox_depths AS d
            (kind, name, queue, state, outcome, shard, value)
        SELECT 'job', c.name, c.queue, c.state, c.outcome, pg_backend_pid(), sum(c.delta)
        FROM (
            SELECT task, queue, state,
                   COALESCE(outcome, ''), 1 FROM depth_new
            UNION ALL
            SELECT task, queue, state,
                   COALESCE(outcome, ''), -1 FROM depth_old
        ) AS c(name, queue, state, outcome, delta)
        GROUP BY 2, 3, 4, 5
        HAVING sum(c.delta) <> 0
        ORDER BY 2, 3, 4, 5
        ON CONFLICT (kind, name, queue, state, outcome, shard)
        DO UPDATE SET value = d.value + excluded.value;
    ELSE
        INSERT INTO __S__.oncebox_depths AS d
            (kind, name, queue, state, outcome, shard, value)
        SELECT 'job', c.name, c.queue, c.state, c.outcome, pg_backend_pid(), sum(c.delta)
        FROM (
            SELECT task, queue, state,
                   COALESCE(outcome, ''), -1 FROM depth_old
        ) AS c(name, queue, state, outcome, delta)
        GROUP BY 2, 3, 4, 5
        HAVING sum(c.delta) <> 0
        ORDER BY 2, 3, 4, 5
        ON CONFLICT (kind, name, queue, state, outcome, shard)
        DO UPDATE SET value = d.value + excluded.value;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER oncebox_jobs_depth_insert AFTER INSERT ON __S__.oncebox_jobs
    REFERENCING NEW TABLE AS depth_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_depth();
CREATE TRIGGER oncebox_jobs_depth_update AFTER UPDATE ON __S__.oncebox_jobs
    REFERENCING OLD TABLE AS depth_old NEW TABLE AS depth_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_depth();
CREATE TRIGGER oncebox_jobs_depth_delete AFTER DELETE ON __S__.oncebox_jobs
    REFERENCING OLD TABLE AS depth_old
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_depth();

CREATE FUNCTION __S__.oncebox_outbox_depth() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- each branch names only the transition tables its operation has (plpgsql plans a
    -- statement when it first runs it)
    IF TG_OP = 'INSERT' THEN
        INSERT INTO __S__.oncebox_depths AS d
            (kind, name, queue, state, outcome, shard, value)
        SELECT 'message', c.name, c.queue, c.state, c.outcome, pg_backend_pid(), sum(c.delta)
        FROM (
            SELECT channel, '', CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END,
                   '', 1 FROM depth_new
        ) AS c(name, queue, state, outcome, delta)
        GROUP BY 2, 3, 4, 5
        HAVING sum(c.delta) <> 0
        ORDER BY 2, 3, 4, 5
        ON CONFLICT (kind, name, queue, state, outcome, shard)
        DO UPDATE SET value = d.value + excluded.value;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO __S__.oncebox_depths AS d
            (kind, name, queue, state, outcome, shard, value)
        SELECT 'message', c.name, c.queue, c.state, c.outcome, pg_backend_pid(), sum(c.delta)
        FROM (
            SELECT channel, '', CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END,
                   '', 1 FROM depth_new
            UNION ALL
            SELECT channel, '', CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END,
                   '', -1 FROM depth_old
        ) AS c(name, queue, state, outcome, delta)
        GROUP BY 2, 3, 4, 5
        HAVING sum(c.delta) <> 0
        ORDER BY 2, 3, 4, 5
        ON CONFLICT (kind, name, queue, state, outcome, shard)
        DO UPDATE SET value = d.value + excluded.value;
    ELSE
        INSERT INTO __S__.oncebox_depths AS d
            (kind, name, queue, state, outcome, shard, value)
        SELECT 'message', c.name, c.queue, c.state, c.outcome, pg_backend_pid(), sum(c.delta)
        FROM (
            SELECT channel, '', CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END,
                   '', -1 FROM depth_old
        ) AS c(name, queue, state, outcome, delta)
        GROUP BY 2, 3, 4, 5
        HAVING sum(c.delta) <> 0
        ORDER BY 2, 3, 4, 5
        ON CONFLICT (kind, name, queue, state, outcome, shard)
        DO UPDATE SET value = d.value + excluded.value;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER oncebox_outbox_depth_insert AFTER INSERT ON __S__.oncebox_outbox
    REFERENCING NEW TABLE AS depth_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_outbox_depth();
CREATE TRIGGER oncebox_outbox_depth_update AFTER UPDATE ON __S__.oncebox_outbox
    REFERENCING OLD TABLE AS depth_old NEW TABLE AS depth_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_outbox_depth();
CREATE TRIGGER oncebox_outbox_depth_delete AFTER DELETE ON __S__.oncebox_outbox
    REFERENCING OLD TABLE AS depth_old
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_outbox_depth();

-- The oldest pending message (`status`, the exporter): the first entry of this index, where a
-- min() would read every pending message of a Monday's run.
CREATE INDEX oncebox_outbox_waiting ON __S__.oncebox_outbox (created_at) WHERE state = 'pending';

-- When each task's first ready job falls due: the first entry for the task, where the due index
-- (run_at) meant walking past every job of the other tasks due before it; the earliest job of
-- several tasks (a worker's idle wait, `status`) is the earliest of their first entries. The
-- due index stays while workers of the release before this one may run (they read it): a later
-- migration drops it — migrations are additive.
CREATE INDEX oncebox_jobs_task_due ON __S__.oncebox_jobs (task, run_at) WHERE state = 'ready';

-- what the tables hold when this migration runs
INSERT INTO __S__.oncebox_depths (kind, name, queue, state, outcome, shard, value)
SELECT 'job', task, queue, state, COALESCE(outcome, ''), 0, count(*)
FROM __S__.oncebox_jobs GROUP BY 2, 3, 4, 5;
INSERT INTO __S__.oncebox_depths (kind, name, queue, state, outcome, shard, value)
SELECT 'message', channel, '', CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END, '',
       0, count(*)
FROM __S__.oncebox_outbox GROUP BY 2, 4;
