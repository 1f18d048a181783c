-- A schedule's delivery-window SLO (oncebox.schedules.slo), recorded by the scheduler that
-- declares it, so `oncebox status` and `oncebox metrics` judge its periods without the app.
ALTER TABLE __S__.oncebox_schedules ADD COLUMN slo_window_s double precision;
ALTER TABLE __S__.oncebox_schedules ADD COLUMN slo_target double precision;
