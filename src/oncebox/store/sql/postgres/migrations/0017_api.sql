-- The HTTP API (api/, docs/api.md): the keys its callers hold, and the Idempotency-Key records
-- of their requests.
-- * A key's secret is 256 random bits shown once at creation; only its SHA-256 is kept (a slow
--   password hash buys nothing against a secret that cannot be guessed) and the server compares
--   digests in constant time. A revoked key keeps its row and name, so what it did stays
--   readable; `rate` is its request budget, kept as a token bucket of oncebox_rate_buckets
--   under the channel `~api/<id>`, shared by every API server.
-- * An Idempotency-Key record belongs to one API key (two callers' keys never meet); `claim` is
--   the request that holds it while in flight (status NULL) and fences its finish; `response` is
--   the first answer's body, replayed to a retry with the same body until `expires_at`.
CREATE TABLE __S__.oncebox_api_keys (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE,
    scopes text NOT NULL,
    secret_sha256 text NOT NULL,
    rate text NOT NULL,
    created_at timestamptz NOT NULL,
    created_by text NOT NULL,
    revoked_at timestamptz
);

CREATE TABLE __S__.oncebox_api_requests (
    api_key_id bigint NOT NULL REFERENCES __S__.oncebox_api_keys (id),
    idempotency_key text NOT NULL,
    fingerprint text NOT NULL,
    claim text NOT NULL,
    status integer,
    response text,
    started_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (api_key_id, idempotency_key)
);
CREATE INDEX oncebox_api_requests_expiry ON __S__.oncebox_api_requests (expires_at);
