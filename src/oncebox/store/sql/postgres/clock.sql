-- The shared clock.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: clock_now
SELECT __S__.oncebox_now();

-- name: clock_read
SELECT frozen_at, offset_by FROM __S__.oncebox_clock WHERE singleton;

-- name: clock_write
INSERT INTO __S__.oncebox_clock (singleton, frozen_at, offset_by)
VALUES (true, %(frozen_at)s, %(offset_by)s)
ON CONFLICT (singleton) DO UPDATE
SET frozen_at = excluded.frozen_at, offset_by = excluded.offset_by;

-- name: clock_reset
DELETE FROM __S__.oncebox_clock;
