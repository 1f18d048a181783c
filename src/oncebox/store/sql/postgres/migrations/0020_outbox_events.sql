-- How many provider events have named each outbox row (deliveries/), counted on the row by the
-- transaction that records each event (outbox_report). The resolver writes a held row only
-- while it is 0 (outbox_resolve): a fence on the row itself, which a write waiting for the
-- event's lock re-reads once that transaction commits — a count of the events table would be
-- read as the write's statement began, without the event.
ALTER TABLE __S__.oncebox_outbox ADD COLUMN events integer NOT NULL DEFAULT 0;
-- The held and dead rows (the ones the resolver may judge, a dead one once replayed) start from
-- the events recorded before; a sent row's count is never read. Those rows are few.
UPDATE __S__.oncebox_outbox o
SET events = (SELECT count(*) FROM __S__.oncebox_provider_events e WHERE e.outbox_id = o.id)
WHERE o.state IN ('ambiguous', 'dead')
  AND EXISTS (SELECT 1 FROM __S__.oncebox_provider_events e WHERE e.outbox_id = o.id);
