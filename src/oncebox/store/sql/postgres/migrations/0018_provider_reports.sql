-- What providers report about the messages they took (deliveries/, docs/guide.md "Provider
-- reports"): signed delivery webhooks, one row per event, matched to its outbox row by the token
-- every send carries (a tag and the X-Oncebox-Token header; never the raw key).
-- * `event_id` is the provider's id of the event (svix-id), the same on each of its retries: a
--   second copy of an event finds its row and changes nothing.
-- * `outbox_id` NULL: an event about a message this database does not hold (another system's on
--   the same provider account, or one pruned) — counted, kept for the dedupe, never acted on.
-- * An outbox row's `reported` is the furthest stage its events reached (accepted < delayed <
--   delivered < failed < bounced < complained), so events that arrive out of order or twice
--   leave it where the furthest one put it; `reported_at` when that stage was recorded.
CREATE TABLE __S__.oncebox_provider_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel text NOT NULL,
    event_id text NOT NULL,
    kind text NOT NULL,
    token text,
    provider_id text,
    outbox_id bigint,
    occurred_at timestamptz,
    received_at timestamptz NOT NULL,
    UNIQUE (channel, event_id)
);
CREATE INDEX oncebox_provider_events_row ON __S__.oncebox_provider_events (outbox_id)
    WHERE outbox_id IS NOT NULL;
CREATE INDEX oncebox_provider_events_received ON __S__.oncebox_provider_events (received_at);

ALTER TABLE __S__.oncebox_outbox ADD COLUMN reported text;
ALTER TABLE __S__.oncebox_outbox ADD COLUMN reported_at timestamptz;
-- An event names its message by token; building this index reads the outbox once (see
-- docs/deploy.md for a large table: it can be built CONCURRENTLY beforehand under this name).
CREATE INDEX IF NOT EXISTS oncebox_outbox_token ON __S__.oncebox_outbox (token);
