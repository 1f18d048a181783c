-- Operations: which schedule period a fan-out's job belongs to (for per-period coverage in
-- `oncebox status`), and the key-drift guard's recorded canaries.
--
-- Adding nullable columns is a catalogue change. The indexes are built under this migration's
-- lock; on a large live table, build them first with CREATE INDEX CONCURRENTLY under the same
-- names (docs/deploy.md): IF NOT EXISTS then skips them.

ALTER TABLE __S__.oncebox_jobs ADD COLUMN schedule text;
ALTER TABLE __S__.oncebox_jobs ADD COLUMN period text;
CREATE INDEX IF NOT EXISTS oncebox_jobs_schedule_period
    ON __S__.oncebox_jobs (schedule, period) WHERE schedule IS NOT NULL;
CREATE INDEX IF NOT EXISTS oncebox_outbox_job ON __S__.oncebox_outbox (job_id);

-- One row per task key template and per schedule period function: what they produced on fixed
-- canary inputs when first seen (or last accepted). A process whose code produces something else
-- refuses that task or schedule until `oncebox keys accept`.
CREATE TABLE __S__.oncebox_key_canaries (
    kind text NOT NULL CHECK (kind IN ('task', 'schedule')),
    name text NOT NULL,
    source text NOT NULL,
    outputs jsonb NOT NULL,
    recorded_at timestamptz NOT NULL,
    PRIMARY KEY (kind, name)
);
