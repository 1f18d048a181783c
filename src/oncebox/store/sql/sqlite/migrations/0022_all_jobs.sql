-- Every job, wherever it is: what every read of a job names (PostgreSQL's migration 0025 splits
-- its jobs into the jobs table and a history of finished ones, and this view joins them). Here
-- the jobs table holds every job; `stage` is its state, as the other store's view says it.
CREATE VIEW oncebox_all_jobs AS SELECT *, state AS stage FROM oncebox_jobs;
