-- What each task's limits were last declared as, and when (jobs/declarations.py): a process
-- whose code limits a task records it when it enqueues the task's jobs (about once a minute)
-- and with every beat of its worker. A worker un-limits the ready jobs of a task it knows
-- without limits (job_unlimit) only when no process has declared that task limited for a while:
-- during a rolling deploy that adds a limit, the old release's workers leave the new release's
-- limited jobs alone. A task never declared limited has no row.
CREATE TABLE __S__.oncebox_limit_declarations (
    task text PRIMARY KEY,
    limits jsonb NOT NULL,          -- as declared: {"partition": ..., "limits": [[name, shown]]}
    declared_at timestamptz NOT NULL
);
