-- Depths by state; see PostgreSQL's 0010. SQLite has row triggers only, and one writer at a
-- time: one shard (0), and a trigger step only when a row's state (or what it is counted under)
-- changes.
CREATE TABLE oncebox_depths (
    kind TEXT NOT NULL CHECK (kind IN ('job', 'message')),
    name TEXT NOT NULL,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    outcome TEXT NOT NULL,
    shard INTEGER NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (kind, name, queue, state, outcome, shard)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER oncebox_jobs_depth_insert AFTER INSERT ON oncebox_jobs
BEGIN
    INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
    VALUES ('job', NEW.task, NEW.queue, NEW.state, COALESCE(NEW.outcome, ''), 0, 1)
    ON CONFLICT (kind, name, queue, state, outcome, shard)
    DO UPDATE SET value = value + excluded.value;
END;

CREATE TRIGGER oncebox_jobs_depth_update AFTER UPDATE OF task, queue, state, outcome
ON oncebox_jobs
WHEN OLD.task IS NOT NEW.task
    OR OLD.queue IS NOT NEW.queue
    OR OLD.state IS NOT NEW.state
    OR OLD.outcome IS NOT NEW.outcome
BEGIN
    INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
    VALUES ('job', OLD.task, OLD.queue, OLD.state, COALESCE(OLD.outcome, ''), 0, -1),
           ('job', NEW.task, NEW.queue, NEW.state, COALESCE(NEW.outcome, ''), 0, 1)
    ON CONFLICT (kind, name, queue, state, outcome, shard)
    DO UPDATE SET value = value + excluded.value;
END;

CREATE TRIGGER oncebox_jobs_depth_delete AFTER DELETE ON oncebox_jobs
BEGIN
    INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
    VALUES ('job', OLD.task, OLD.queue, OLD.state, COALESCE(OLD.outcome, ''), 0, -1)
    ON CONFLICT (kind, name, queue, state, outcome, shard)
    DO UPDATE SET value = value + excluded.value;
END;

CREATE TRIGGER oncebox_outbox_depth_insert AFTER INSERT ON oncebox_outbox
BEGIN
    INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
    VALUES ('message', NEW.channel, '',
            CASE WHEN NEW.discarded_at IS NULL THEN NEW.state ELSE 'discarded' END, '', 0, 1)
    ON CONFLICT (kind, name, queue, state, outcome, shard)
    DO UPDATE SET value = value + excluded.value;
END;

CREATE TRIGGER oncebox_outbox_depth_update AFTER UPDATE OF channel, state, discarded_at
ON oncebox_outbox
WHEN OLD.channel IS NOT NEW.channel
    OR OLD.state IS NOT NEW.state
    OR OLD.discarded_at IS NOT NEW.discarded_at
BEGIN
    INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
    VALUES ('message', OLD.channel, '',
            CASE WHEN OLD.discarded_at IS NULL THEN OLD.state ELSE 'discarded' END, '', 0, -1),
           ('message', NEW.channel, '',
            CASE WHEN NEW.discarded_at IS NULL THEN NEW.state ELSE 'discarded' END, '', 0, 1)
    ON CONFLICT (kind, name, queue, state, outcome, shard)
    DO UPDATE SET value = value + excluded.value;
END;

CREATE TRIGGER oncebox_outbox_depth_delete AFTER DELETE ON oncebox_outbox
BEGIN
    INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
    VALUES ('message', OLD.channel, '',
            CASE WHEN OLD.discarded_at IS NULL THEN OLD.state ELSE 'discarded' END, '', 0, -1)
    ON CONFLICT (kind, name, queue, state, outcome, shard)
    DO UPDATE SET value = value + excluded.value;
END;

-- The oldest pending message (`status`, the exporter): the first entry of this index, where a
-- min() would read every pending message of a Monday's run.
CREATE INDEX oncebox_outbox_waiting ON oncebox_outbox (created_at) WHERE state = 'pending';

-- When each task's first ready job falls due: the first entry for the task, where the due index
-- (run_at) meant walking past every job of the other tasks due before it; the earliest job of
-- several tasks (a worker's idle wait, `status`) is the earliest of their first entries. The
-- due index stays while workers of the release before this one may run (they read it): a later
-- migration drops it — migrations are additive.
CREATE INDEX oncebox_jobs_task_due ON oncebox_jobs (task, run_at) WHERE state = 'ready';

-- what the tables hold when this migration runs
INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
SELECT 'job', task, queue, state, COALESCE(outcome, ''), 0, count(*)
FROM oncebox_jobs GROUP BY 2, 3, 4, 5;
INSERT INTO oncebox_depths (kind, name, queue, state, outcome, shard, value)
SELECT 'message', channel, '', CASE WHEN discarded_at IS NULL THEN state ELSE 'discarded' END, '',
       0, count(*)
FROM oncebox_outbox GROUP BY 2, 4;
