-- A group's head is the job decided first under the group's lock, not the lowest id (0016's
-- trigger, replaced): a job's id is taken when its row is inserted, its publish decided when its
-- statement ends, so a batch that inserted a job of a group and then waited (on another
-- transaction's row with the same key, or behind a long batch) let a later enqueue of that
-- group — a higher id, the batch's row not yet visible — publish, and then published its own:
-- two heads in the broker, the later first. A replayed older job, handed to the relay while its
-- group's head was in the broker, did the same. So a job of a group is published only while no
-- other job of its group is relayed with its current attempt's publish written (that row is the
-- head's mark: the relay's outbox rows are kept while their job is), and still only while no
-- earlier job of its group waits or runs; when the head ends, the earliest waiting job is next.
-- A head stays the head while it retries: a relayed job at a new attempt was delivered, so it
-- is its group's head, and its next attempt is published whatever waits behind it (an older
-- job waiting behind a later head must not hold that head's retry back, or neither is
-- published and the group stops).
-- The order promised: a group's jobs run one at a time, and a job enqueued after another's
-- enqueue committed runs after it; of enqueues that overlap, either may go first.
--
-- The publish also names the job's group (`group`), so a broker that serialises a group's
-- messages itself (SQS FIFO's MessageGroupId) does so too; a publish written before has none.
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
                            AND g.state IN ('ready', 'leased', 'relayed')
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
              AND g.state IN ('ready', 'leased', 'relayed')))
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
