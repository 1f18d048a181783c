-- An operator can discard a dead message that will never be sent as frozen (docs/runbook.md,
-- "A message no provider can take"). A discarded row keeps state 'dead' and is read back as
-- 'discarded', as on SQLite (which cannot widen the state's CHECK without rebuilding the table):
-- one shape of row on both stores.
ALTER TABLE __S__.oncebox_outbox ADD COLUMN discarded_at timestamptz;
