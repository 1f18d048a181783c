-- The key-drift guard: key canaries.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: key_canary_list
SELECT kind, name, source, outputs, recorded_at
FROM oncebox_key_canaries
ORDER BY kind, name;

-- name: key_canary_get
SELECT kind, name, source, outputs, recorded_at
FROM oncebox_key_canaries
WHERE kind = :kind AND name = :name;

-- name: key_canary_record
INSERT INTO oncebox_key_canaries (kind, name, source, outputs, recorded_at)
VALUES (:kind, :name, :source, :outputs, :now)
ON CONFLICT (kind, name) DO NOTHING;

-- name: key_canary_accept
-- no fence: an operator accepts the code's canaries whatever was recorded, audited in the
--   statement
INSERT INTO oncebox_key_canaries (kind, name, source, outputs, recorded_at)
VALUES (:kind, :name, :source, :outputs, :now)
ON CONFLICT (kind, name) DO UPDATE
    SET source = excluded.source, outputs = excluded.outputs, recorded_at = excluded.recorded_at
RETURNING name;

-- name: key_canary_accept__audit
INSERT INTO oncebox_audit (at, actor, action, target_kind, target_id, target_key, reason, details)
VALUES (:now, :actor, 'accept-keys', :kind, NULL, :name, :reason,
        json_object('was', :was, 'was_outputs', json(:was_outputs), 'now', :source,
                    'now_outputs', json(:outputs)))
RETURNING id;
