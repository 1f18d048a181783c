-- Durable counters (docs/guide.md, "The numbers"): what happened, counted in the transaction that
-- did it, shared by every process and kept across restarts and prunes. Each transaction adds to
-- the shard of its connection (its backend pid modulo 256), so concurrent writers add to
-- different rows and none waits for another's commit; readers sum the shards. The fill factor
-- leaves room on each page for its rows' next versions (HOT updates need no vacuum to reuse it).
CREATE TABLE __S__.oncebox_counters (
    name text NOT NULL,
    shard integer NOT NULL,
    value bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (name, shard)
) WITH (fillfactor = 50);
