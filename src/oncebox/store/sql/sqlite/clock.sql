-- The shared clock.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: clock_now
SELECT oncebox_now() AS now;

-- name: clock_audit
-- An operator's change of the clock setting (`oncebox clock reset`), in the audit log.
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'clock-reset', 'clock', NULL, NULL, :reason, :details);
