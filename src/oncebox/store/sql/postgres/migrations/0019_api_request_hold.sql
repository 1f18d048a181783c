-- An Idempotency-Key record's holder keeps it by renewing `held_until` while its request runs
-- (api/idempotency.py): another request with the key takes it over only once that has passed —
-- its holder has gone — not a fixed time after the request started. NULL on a record a server
-- from before this migration holds: it is taken over 60 s after its start, as that server would.
ALTER TABLE __S__.oncebox_api_requests ADD COLUMN held_until timestamptz;
