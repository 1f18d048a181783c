-- The HTTP API's keys and Idempotency-Key records (api/, migration 0017).
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: api_key_insert
-- A new key; nothing when the name is taken (a revoked key keeps its name).
INSERT INTO __S__.oncebox_api_keys (name, scopes, secret_sha256, rate, created_at, created_by)
VALUES (%(name)s, %(scopes)s, %(secret_sha256)s, %(rate)s, __S__.oncebox_now(), %(created_by)s)
ON CONFLICT (name) DO NOTHING
RETURNING id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at;

-- name: api_key_get
SELECT id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at
FROM __S__.oncebox_api_keys WHERE id = %(id)s;

-- name: api_key_list
SELECT id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at
FROM __S__.oncebox_api_keys ORDER BY name;

-- name: api_key_revoke
-- Revoke the named key (a second revoke keeps the first instant).
-- no fence: a revoke is decided from nothing read, and a second keeps the first instant
UPDATE __S__.oncebox_api_keys SET revoked_at = coalesce(revoked_at, __S__.oncebox_now())
WHERE name = %(name)s
RETURNING id, name, scopes, secret_sha256, rate, created_at, created_by, revoked_at;

-- name: api_request_claim
-- Hold an Idempotency-Key for this request until %(hold_s)s from now (its holder renews that
-- while it runs: api_request_renew): a key never seen, a record expired, or an in-flight record
-- of the same body whose hold ran out — its holder has gone (the retry takes over; the work
-- itself is keyed, so running it again writes nothing twice). A holder at work keeps it however
-- long it runs. The hold is compared and set in this one statement on the row it locks: of two
-- requests taking over one record, the second finds it held again. A record without a hold is an
-- older server's, taken over 60 s after its start as that server would. Nothing returned: the
-- key is held, answered, or was used with another body — read it.
-- fence: expires_at, status, fingerprint, held_until, started_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
INSERT INTO __S__.oncebox_api_requests AS r
    (api_key_id, idempotency_key, fingerprint, claim, status, response, started_at, expires_at,
     held_until)
SELECT %(api_key_id)s, %(idempotency_key)s, %(fingerprint)s, %(claim)s, NULL, NULL, now,
       now + make_interval(secs => %(retain_s)s), now + make_interval(secs => %(hold_s)s)
FROM clock
ON CONFLICT (api_key_id, idempotency_key) DO UPDATE
SET fingerprint = excluded.fingerprint, claim = excluded.claim, status = NULL, response = NULL,
    started_at = excluded.started_at, expires_at = excluded.expires_at,
    held_until = excluded.held_until
WHERE r.expires_at <= excluded.started_at
   OR (r.status IS NULL AND r.fingerprint = excluded.fingerprint
       AND coalesce(r.held_until, r.started_at + interval '60 seconds') <= excluded.started_at)
RETURNING r.api_key_id, r.idempotency_key, r.fingerprint, r.claim, r.status, r.response,
          r.started_at, r.expires_at, r.held_until;

-- name: api_request_renew
-- The holder of a key, still at work, holds it %(hold_s)s from now. Nothing when it was taken
-- over (its hold had run out: the holder then records nothing either) or answered.
-- fence: claim, status
UPDATE __S__.oncebox_api_requests
SET held_until = __S__.oncebox_now() + make_interval(secs => %(hold_s)s)
WHERE api_key_id = %(api_key_id)s AND idempotency_key = %(idempotency_key)s
  AND claim = %(claim)s AND status IS NULL
RETURNING claim;

-- name: api_request_get
-- The record of a key, unless expired.
SELECT api_key_id, idempotency_key, fingerprint, claim, status, response, started_at, expires_at,
       held_until
FROM __S__.oncebox_api_requests
WHERE api_key_id = %(api_key_id)s AND idempotency_key = %(idempotency_key)s
  AND expires_at > __S__.oncebox_now();

-- name: api_request_finish
-- Record the first answer, by the request that holds the key (a holder that lost it to a
-- takeover records nothing).
-- fence: claim, status
UPDATE __S__.oncebox_api_requests SET status = %(status)s, response = %(response)s
WHERE api_key_id = %(api_key_id)s AND idempotency_key = %(idempotency_key)s
  AND claim = %(claim)s AND status IS NULL
RETURNING claim;

-- name: api_request_release
-- Let the key go after an answer that is not to be replayed (the server failed): a retry runs.
-- fence: claim, status
DELETE FROM __S__.oncebox_api_requests
WHERE api_key_id = %(api_key_id)s AND idempotency_key = %(idempotency_key)s
  AND claim = %(claim)s AND status IS NULL
RETURNING claim;

-- name: api_request_prune
-- Delete up to %(limit)s expired records, oldest first (oncebox_api_requests_expiry). The
-- expiry is checked again on each row the delete locks: a record a request took over after the
-- subquery read it is no longer expired, and stays.
-- fence: expires_at
WITH clock AS MATERIALIZED (SELECT __S__.oncebox_now() AS now)
DELETE FROM __S__.oncebox_api_requests
WHERE (api_key_id, idempotency_key) IN (
    SELECT api_key_id, idempotency_key FROM __S__.oncebox_api_requests
    WHERE expires_at <= (SELECT now FROM clock)
    ORDER BY expires_at
    LIMIT %(limit)s)
  AND expires_at <= (SELECT now FROM clock)
RETURNING api_key_id;
