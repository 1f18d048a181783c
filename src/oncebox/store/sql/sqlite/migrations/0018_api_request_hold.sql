-- An Idempotency-Key record's holder keeps it by renewing `held_until`; see PostgreSQL's 0019.
ALTER TABLE oncebox_api_requests ADD COLUMN held_until INTEGER;
