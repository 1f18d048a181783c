-- The HTTP API's keys and Idempotency-Key records (api/, migration 0016).
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: api_key_insert
INSERT INTO oncebox_api_keys (name, scopes, secret_sha256, rate, created_at, created_by)
VALUES (:name, :scopes, :secret_sha256, :rate, :now, :created_by)
ON CONFLICT (name) DO NOTHING
RETURNING id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at;

-- name: api_key_get
SELECT id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at
FROM oncebox_api_keys WHERE id = :id;

-- name: api_key_list
SELECT id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at
FROM oncebox_api_keys ORDER BY name;

-- name: api_key_revoke
-- no fence: a revoke is decided from nothing read, and a second keeps the first instant
UPDATE oncebox_api_keys SET revoked_at = coalesce(revoked_at, :now)
WHERE name = :name
RETURNING id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at;

-- name: api_request_claim
-- See the PostgreSQL statement.
-- fence: expires_at, status, fingerprint, held_until, started_at
INSERT INTO oncebox_api_requests AS r
    (api_key_id, idempotency_key, fingerprint, claim, status, response, started_at, expires_at,
     held_until)
VALUES (:api_key_id, :idempotency_key, :fingerprint, :claim, NULL, NULL, :now,
        :now + :retain_us, :now + :hold_us)
ON CONFLICT (api_key_id, idempotency_key) DO UPDATE
SET fingerprint = excluded.fingerprint, claim = excluded.claim, status = NULL, response = NULL,
    started_at = excluded.started_at, expires_at = excluded.expires_at,
    held_until = excluded.held_until
WHERE r.expires_at <= excluded.started_at
   OR (r.status IS NULL AND r.fingerprint = excluded.fingerprint
       AND coalesce(r.held_until, r.started_at + 60000000) <= excluded.started_at)
RETURNING api_key_id, idempotency_key, fingerprint, claim, status, response, started_at,
          expires_at, held_until;

-- name: api_request_renew
-- fence: claim, status
UPDATE oncebox_api_requests SET held_until = :now + :hold_us
WHERE api_key_id = :api_key_id AND idempotency_key = :idempotency_key
  AND claim = :claim AND status IS NULL
RETURNING claim;

-- name: api_request_get
SELECT api_key_id, idempotency_key, fingerprint, claim, status, response, started_at, expires_at,
       held_until
FROM oncebox_api_requests
WHERE api_key_id = :api_key_id AND idempotency_key = :idempotency_key AND expires_at > :now;

-- name: api_request_finish
-- fence: claim, status
UPDATE oncebox_api_requests SET status = :status, response = :response
WHERE api_key_id = :api_key_id AND idempotency_key = :idempotency_key
  AND claim = :claim AND status IS NULL
RETURNING claim;

-- name: api_request_release
-- fence: claim, status
DELETE FROM oncebox_api_requests
WHERE api_key_id = :api_key_id AND idempotency_key = :idempotency_key
  AND claim = :claim AND status IS NULL
RETURNING claim;

-- name: api_request_prune
-- fence: expires_at
DELETE FROM oncebox_api_requests
WHERE (api_key_id, idempotency_key) IN (
    SELECT api_key_id, idempotency_key FROM oncebox_api_requests
    WHERE expires_at <= :now
    ORDER BY expires_at
    LIMIT :limit)
RETURNING api_key_id;
