-- A schedule's delivery-window SLO; see PostgreSQL's 0009.
ALTER TABLE oncebox_schedules ADD COLUMN slo_window_s REAL;
ALTER TABLE oncebox_schedules ADD COLUMN slo_target REAL;
