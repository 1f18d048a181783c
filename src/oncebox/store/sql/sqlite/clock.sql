-- The shared clock.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: clock_now
SELECT oncebox_now();
