-- Broker-backed queues (transports/rabbitmq.py, docs/transports.md): a job of a queue a broker
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
ALTER TABLE __S__.oncebox_jobs DROP CONSTRAINT oncebox_jobs_state_check;
ALTER TABLE __S__.oncebox_jobs ADD CONSTRAINT oncebox_jobs_state_check
    CHECK (state IN ('ready', 'leased', 'relayed', 'done', 'dead', 'cancelled')) NOT VALID;
ALTER TABLE __S__.oncebox_jobs VALIDATE CONSTRAINT oncebox_jobs_state_check;

CREATE FUNCTION __S__.oncebox_jobs_relay() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- each branch names only the transition tables its operation has (see oncebox_jobs_depth)
    IF TG_OP = 'INSERT' THEN
        INSERT INTO __S__.oncebox_outbox
            (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at,
             trace_context)
        SELECT '~relay/' || n.id || '/' || (n.attempt + 1), '~relay/' || n.id,
               '~broker.' || n.queue,
               jsonb_build_object('job', n.id, 'run', n.attempt + 1, 'task', n.task,
                                  'args', n.args),
               'relay-' || n.id || '-' || (n.attempt + 1), n.id, n.run_at,
               (SELECT __S__.oncebox_now()), n.trace_context
        FROM relay_new n
        WHERE n.state = 'relayed'
        ORDER BY n.id
        ON CONFLICT (key) DO NOTHING;
    ELSE
        INSERT INTO __S__.oncebox_outbox
            (key, intent_key, channel, payload, token, job_id, next_attempt_at, created_at,
             trace_context)
        SELECT '~relay/' || n.id || '/' || (n.attempt + 1), '~relay/' || n.id,
               '~broker.' || n.queue,
               jsonb_build_object('job', n.id, 'run', n.attempt + 1, 'task', n.task,
                                  'args', n.args),
               'relay-' || n.id || '-' || (n.attempt + 1), n.id, n.run_at,
               (SELECT __S__.oncebox_now()), n.trace_context
        FROM relay_new n JOIN relay_old o ON o.id = n.id
        WHERE n.state = 'relayed' AND (o.state <> 'relayed' OR o.attempt <> n.attempt)
        ORDER BY n.id
        ON CONFLICT (key) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER oncebox_jobs_relay_insert AFTER INSERT ON __S__.oncebox_jobs
    REFERENCING NEW TABLE AS relay_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_relay();
CREATE TRIGGER oncebox_jobs_relay_update AFTER UPDATE ON __S__.oncebox_jobs
    REFERENCING OLD TABLE AS relay_old NEW TABLE AS relay_new
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_jobs_relay();
