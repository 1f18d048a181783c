-- An operator can discard a dead message that will never be sent as frozen (docs/runbook.md,
-- "A message no provider can take"). A discarded row keeps state 'dead' and is read back as
-- 'discarded': SQLite cannot widen the state's CHECK without rebuilding the table, and a nullable
-- column says the same thing. See PostgreSQL's 0007.
ALTER TABLE oncebox_outbox ADD COLUMN discarded_at INTEGER;
