-- What a schedule period's pruned jobs counted (docs/guide.md, "The numbers"): the pruner adds
-- each done job it deletes to its run's summary in the same statement (job_prune), so "did
-- everyone get W33?" still has an answer once the jobs are gone. A job is pruned only once every
-- message it wrote is sent (or discarded), so what it counted can no longer change: done and
-- covered, its messages sent, and whether it was covered within the schedule's delivery window —
-- judged by the window declared when it was pruned (`pruned_window_s`; none declared: not on
-- time), and by that same window for the rest of the period's pruned jobs.
ALTER TABLE __S__.oncebox_schedule_runs ADD COLUMN pruned_done bigint NOT NULL DEFAULT 0;
ALTER TABLE __S__.oncebox_schedule_runs ADD COLUMN pruned_sent bigint NOT NULL DEFAULT 0;
ALTER TABLE __S__.oncebox_schedule_runs ADD COLUMN pruned_on_time bigint NOT NULL DEFAULT 0;
ALTER TABLE __S__.oncebox_schedule_runs ADD COLUMN pruned_window_s double precision;
