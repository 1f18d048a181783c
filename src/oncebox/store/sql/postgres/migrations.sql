-- The record of applied migrations.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS __S__.oncebox_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_table_exists
-- Whether the schema was ever migrated: reading the status creates nothing.
SELECT to_regclass('__S__.oncebox_migrations') IS NOT NULL AS found;

-- name: migration_lock
-- Serialise concurrent `oncebox migrate` runs for the whole transaction.
SELECT pg_advisory_xact_lock(hashtext('oncebox_migrate:' || %(schema)s));

-- name: migration_lock_timeout
-- A migration that waits on a busy table holds every worker's query behind it: it gives up after
-- %(milliseconds)s rather than stall the queue (see docs/deploy.md). For this transaction only.
SELECT set_config('lock_timeout', %(milliseconds)s, true);

-- name: migration_schema_create
-- After the lock: concurrent `CREATE SCHEMA IF NOT EXISTS` can still collide.
CREATE SCHEMA IF NOT EXISTS __S__;

-- name: migration_list
SELECT version, name, checksum FROM __S__.oncebox_migrations ORDER BY version;

-- name: migration_record
INSERT INTO __S__.oncebox_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s);
