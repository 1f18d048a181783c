-- The shared clock.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: clock_now
SELECT __S__.oncebox_now() AS now;

-- name: clock_read
-- The setting as written, and whether it has lapsed (oncebox_now() then ignores it).
SELECT frozen_at, offset_by AS "offset", owner, expires_at,
       expires_at IS NOT NULL AND expires_at <= now() AS lapsed
FROM __S__.oncebox_clock WHERE singleton;

-- name: clock_write
-- no fence: written by the clock's owner, after clock.py refused a live foreign setting
INSERT INTO __S__.oncebox_clock (singleton, frozen_at, offset_by, owner, expires_at)
VALUES (true, %(frozen_at)s, %(offset_by)s, %(owner)s, %(expires_at)s)
ON CONFLICT (singleton) DO UPDATE
SET frozen_at = excluded.frozen_at, offset_by = excluded.offset_by, owner = excluded.owner,
    expires_at = excluded.expires_at;

-- name: clock_reset
-- no fence: an operator's reset of the shared test clock, whatever it holds, audited (clock_audit)
DELETE FROM __S__.oncebox_clock;

-- name: clock_audit
-- An operator's change of the clock setting (`oncebox clock reset`), in the audit log.
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (now(), %(actor)s, 'clock-reset', 'clock', NULL, NULL, %(reason)s, %(details)s);
