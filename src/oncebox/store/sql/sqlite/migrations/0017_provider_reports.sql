-- What providers report about the messages they took; see PostgreSQL's 0018.
CREATE TABLE oncebox_provider_events (
    id INTEGER PRIMARY KEY,
    channel TEXT NOT NULL,
    event_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    token TEXT,
    provider_id TEXT,
    outbox_id INTEGER,
    occurred_at INTEGER,
    received_at INTEGER NOT NULL,
    UNIQUE (channel, event_id)
) STRICT;
CREATE INDEX oncebox_provider_events_row ON oncebox_provider_events (outbox_id)
    WHERE outbox_id IS NOT NULL;
CREATE INDEX oncebox_provider_events_received ON oncebox_provider_events (received_at);

ALTER TABLE oncebox_outbox ADD COLUMN reported TEXT;
ALTER TABLE oncebox_outbox ADD COLUMN reported_at INTEGER;
CREATE INDEX oncebox_outbox_token ON oncebox_outbox (token);
