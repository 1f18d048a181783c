-- When a fan-out's owner last renewed its run (schedules/owners.py): an owner renews every few
-- seconds while it fans out, whatever its batches do, so one that stopped renewing is gone
-- before its lease runs out — `status` says so, and an operator may take its run over at once
-- (`oncebox schedule run --take-over`). NULL, or older than the run's `started_at` (a claim by
-- a release that does not renew): the owner is judged by its lease alone.
ALTER TABLE __S__.oncebox_schedule_runs ADD COLUMN renewed_at timestamptz;
