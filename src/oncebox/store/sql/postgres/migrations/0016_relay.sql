-- Broker-backed queues (brokers/rabbitmq/transport.py, docs/transports.md): a job of a queue a broker
-- holds keeps its record here, in a state of its own.
-- * `relayed`: the job is the broker's to deliver. It is never leased from the table (it is in
--   no lease index), the consumer that receives its message settles the row, fenced on its
--   attempt (`job_settle_relayed`), and `jobs`, `dlq`, `cancel` and the counts read it as any
--   job. The state constraint is swapped without a long lock: added NOT VALID, then validated
--   (which reads the table but lets writes through).
-- * The relay: every statement that makes a job `relayed`, or moves a relayed job to its next
--   attempt, writes in the same transaction the outbox row that publishes that attempt — key
--   `~relay/<job id>/<attempt>`, channel `~broker.<queue>`, due at the job's run_at — and the
--   outbox dispatcher publishes it with the broker's confirms, retried and fenced like any
--   message. A trigger, so that no path (enqueue, a schedule's fan-out, a retry, a worker
--   adopting a replayed job) can commit a relayed job without its publish.
-- * Ordered groups: a job of a group (`group_by`) is published only while no earlier job of its
--   group is waiting or running, and the job that ends a group's head (done, dead, cancelled)
--   publishes the next one — so the broker holds at most one job per group, and any number of
--   consumers keep each group in order while groups run side by side. Two transactions deciding
--   for one group at once (a head settled while the next job is enqueued, two enqueues into an
--   empty group) would each miss the other's uncommitted row: the trigger first takes a
--   transaction-scoped advisory lock per group it touches, in one order, so the second decides
--   after the first committed (each statement of a trigger function sees what committed before
--   it). The index below finds a group's waiting or running jobs for those decisions.
ALTER TABLE __S__.oncebox_jobs DROP CONSTRAINT oncebox_jobs_state_check;
ALTER TABLE __S__.oncebox_jobs ADD CONSTRAINT oncebox_jobs_state_check
    CHECK (state IN ('ready', 'leased', 'relayed', 'done', 'dead', 'cancelled')) NOT VALID;
ALTER TABLE __S__.oncebox_jobs VALIDATE CONSTRAINT oncebox_jobs_state_check;

CREATE FUNCTION __S__.oncebox_jobs_relay() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    due bigint[];  -- the jobs whose next attempt is to be published now
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
            -- relayed now, or relayed at a new attempt: publish that attempt
            SELECT id FROM changed
            WHERE state = 'relayed' AND (was <> 'relayed' OR next_attempt)
            UNION
            -- a group's head ended: its next job is the head now
            SELECT h.id
            FROM (SELECT DISTINCT queue, group_key FROM changed
                  WHERE group_key IS NOT NULL AND was IN ('ready', 'leased', 'relayed')
                    AND state NOT IN ('ready', 'leased', 'relayed')) f,
                 LATERAL (SELECT g.id, g.state FROM __S__.oncebox_jobs g
                          WHERE g.queue = f.queue AND g.group_key = f.group_key
                            AND g.state IN ('ready', 'leased', 'relayed')
                          ORDER BY g.id LIMIT 1) h
            WHERE h.state = 'relayed'
        ) d;
    END IF;
    -- a job of a group waits while an earlier job of its group waits or runs
    SELECT array_agg(j.id ORDER BY j.id) INTO due
    FROM __S__.oncebox_jobs j
    WHERE j.id = ANY(due) AND j.state = 'relayed'
      AND (j.group_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM __S__.oncebox_jobs g
            WHERE g.queue = j.queue AND g.group_key = j.group_key AND g.id < j.id
              AND g.state IN ('ready', 'leased', 'relayed')));
    IF due IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO __S__.oncebox_outbox
        (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at,
         trace_context)
    SELECT '~relay/' || j.id || '/' || (j.attempt + 1), '~relay/' || j.id,
           '~broker.' || j.queue,
           jsonb_build_object('job', j.id, 'run', j.attempt + 1, 'task', j.task, 'args', j.args),
           'relay-' || j.id || '-' || (j.attempt + 1), j.id, j.run_at,
           (SELECT __S__.oncebox_now()), j.trace_context
    FROM __S__.oncebox_jobs j
    WHERE j.id = ANY(due)
    ORDER BY j.id
    ON CONFLICT (key) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER oncebox_jobs_relay_insert AFTER INSERT ON __S__.oncebox_jobs
    REFERENCING NEW TABLE AS relay_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_relay();
CREATE TRIGGER oncebox_jobs_relay_update AFTER UPDATE ON __S__.oncebox_jobs
    REFERENCING OLD TABLE AS relay_old NEW TABLE AS relay_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_relay();

CREATE INDEX oncebox_jobs_group_active ON __S__.oncebox_jobs (queue, group_key, id)
    WHERE group_key IS NOT NULL AND state IN ('ready', 'leased', 'relayed');
