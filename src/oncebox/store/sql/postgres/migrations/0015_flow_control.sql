-- Flow control (jobs/limits.py, docs/guide.md "Keys, limits and debounce"):
-- * `limit_key`: a limited task's job carries its partition ('' for a task limited as a whole;
--   NULL for a job no limit holds). The claim index now holds only jobs no limit holds, so an
--   unlimited lease never steps over a limited task's waiting backlog; limited jobs are leased
--   through their own index, partition by partition (a skip scan over (task, limit_key)), and
--   the slots in use are the leased jobs counted through the last index.
-- * `debounce_key`: a debounced task's job still waiting to run, by its debounce key; the lease
--   clears it, so a later enqueue starts a new pending job while this one runs, and a retry or
--   release back to ready never meets the unique index.
-- * oncebox_limits: a rate limit's token bucket per limit and partition ('' for the whole
--   limit), also the row every lease of the limit locks first; and a throttle's last run.
-- Both columns are nullable without a default: added without rewriting the table. Rebuilding the
-- claim index blocks writes to the jobs table until the migration's transaction ends: run it
-- before the workers of this release start (deploy.md, "Upgrading").
ALTER TABLE __S__.oncebox_jobs ADD COLUMN limit_key text, ADD COLUMN debounce_key text;
DROP INDEX __S__.oncebox_jobs_claim;
CREATE INDEX oncebox_jobs_claim ON __S__.oncebox_jobs (priority DESC, run_at, id)
    WHERE state = 'ready' AND limit_key IS NULL;
CREATE INDEX oncebox_jobs_limited ON __S__.oncebox_jobs
    (task, limit_key, priority DESC, run_at, id)
    WHERE state = 'ready' AND limit_key IS NOT NULL;
CREATE INDEX oncebox_jobs_limited_leased ON __S__.oncebox_jobs (task, limit_key)
    WHERE state = 'leased' AND limit_key IS NOT NULL;
CREATE UNIQUE INDEX oncebox_jobs_debounce ON __S__.oncebox_jobs (debounce_key)
    WHERE state = 'ready' AND debounce_key IS NOT NULL;

CREATE TABLE __S__.oncebox_limits (
    name text NOT NULL,
    partition text NOT NULL,
    tokens double precision,      -- a bucket's level at updated_at; NULL: full
    updated_at timestamptz,
    PRIMARY KEY (name, partition)
) WITH (fillfactor = 50);
