-- The key-drift guard: key canaries.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: key_canary_list
SELECT kind, name, source, outputs::text, recorded_at
FROM __S__.oncebox_key_canaries
ORDER BY kind, name;

-- name: key_canary_get
SELECT kind, name, source, outputs::text, recorded_at
FROM __S__.oncebox_key_canaries
WHERE kind = %(kind)s AND name = %(name)s;

-- name: key_canary_record
-- First sight of a template or period function: record it, unless another process just did.
INSERT INTO __S__.oncebox_key_canaries (kind, name, source, outputs, recorded_at)
VALUES (%(kind)s, %(name)s, %(source)s, %(outputs)s::jsonb, __S__.oncebox_now())
ON CONFLICT (kind, name) DO NOTHING;

-- name: key_canary_accept
-- An operator accepts the code's current canaries, audited in the same statement.
-- no fence: an operator accepts the code's canaries whatever was recorded, audited in the
--   statement
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now),
previous AS (
    SELECT source, outputs FROM __S__.oncebox_key_canaries
    WHERE kind = %(kind)s AND name = %(name)s
),
accepted AS (
    INSERT INTO __S__.oncebox_key_canaries (kind, name, source, outputs, recorded_at)
    SELECT %(kind)s, %(name)s, %(source)s, %(outputs)s::jsonb, now FROM clock
    ON CONFLICT (kind, name) DO UPDATE
        SET source = EXCLUDED.source, outputs = EXCLUDED.outputs,
            recorded_at = EXCLUDED.recorded_at
    RETURNING name
)
INSERT INTO __S__.oncebox_audit
    (at, actor, action, target_kind, target_id, target_key, reason, details)
SELECT clock.now, %(actor)s, 'accept-keys', %(kind)s, NULL, %(name)s, %(reason)s,
       jsonb_build_object('was', (SELECT source FROM previous),
                          'was_outputs', (SELECT outputs FROM previous),
                          'now', %(source)s::text, 'now_outputs', %(outputs)s::jsonb)
FROM clock, accepted
RETURNING id;
