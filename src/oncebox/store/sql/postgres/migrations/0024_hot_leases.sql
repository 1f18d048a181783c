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
-- (the relay's trigger reads a group's jobs through it once 0025, applied with this one,
-- rewrites its reads in `stage`)
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

