-- What a schedule period's pruned jobs counted; see PostgreSQL's 0011.
ALTER TABLE oncebox_schedule_runs ADD COLUMN pruned_done INTEGER NOT NULL DEFAULT 0;
ALTER TABLE oncebox_schedule_runs ADD COLUMN pruned_sent INTEGER NOT NULL DEFAULT 0;
ALTER TABLE oncebox_schedule_runs ADD COLUMN pruned_on_time INTEGER NOT NULL DEFAULT 0;
ALTER TABLE oncebox_schedule_runs ADD COLUMN pruned_window_s REAL;
