-- What "nothing eligible is lost" needs from the schema (docs/guarantees.md, liveness).
--
-- 1. A test clock has an owner and lapses. A frozen or offset setting records the process that
-- wrote it and, when held through a lease, the real time at which it lapses unless renewed:
-- oncebox_now() ignores a lapsed setting, so a test or demo killed while holding the clock
-- cannot leave a deployment on frozen time.
ALTER TABLE __S__.oncebox_clock
    ADD COLUMN owner text,
    ADD COLUMN expires_at timestamptz;

CREATE OR REPLACE FUNCTION __S__.oncebox_now() RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN COALESCE(
        (SELECT COALESCE(c.frozen_at, now() + c.offset_by)
           FROM __S__.oncebox_clock c
          WHERE c.singleton AND (c.expires_at IS NULL OR c.expires_at > now())),
        now());
END
$$;

-- 2. Outbox rows count the leases that expired on them without a send being recorded, so a
-- message that kills its dispatcher every time is held or dead-lettered after a bound instead
-- of going back to pending for ever.
ALTER TABLE __S__.oncebox_outbox ADD COLUMN rescues integer NOT NULL DEFAULT 0;

-- 3. The live workers: each worker process writes its row at start and refreshes it while it
-- runs, with the tasks, queues and channels it serves, so `status` can name the jobs no live
-- worker serves (a task removed in a deploy) instead of leaving them ready in silence.
CREATE TABLE __S__.oncebox_workers (
    name text COLLATE "C" PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    tasks jsonb NOT NULL,
    queues jsonb NOT NULL,
    channels jsonb NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at timestamptz NOT NULL,
    stopped_at timestamptz
);
