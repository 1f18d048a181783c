-- New outbox rows notify on a channel of their own (`oncebox_outbox`), so a worker wakes its
-- dispatcher for them and its consumers for jobs only: before, every enqueue also sent each idle
-- dispatcher through a lease round (at 200 jobs/s that round made the enqueue-to-handler
-- latency three times longer; docs/benchmarks.md). Workers of the previous release listen on
-- `oncebox_jobs` alone: their dispatchers then find other processes' outbox rows by their poll
-- interval (their own consumers' rows still wake them at once).
CREATE FUNCTION __S__.oncebox_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oncebox_outbox', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;

DROP TRIGGER oncebox_outbox_notify ON __S__.oncebox_outbox;
CREATE TRIGGER oncebox_outbox_notify AFTER INSERT ON __S__.oncebox_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION __S__.oncebox_outbox_notify();
