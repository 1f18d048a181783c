-- The record of applied migrations.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS __S__.oncebox_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_lock
-- Serialise concurrent `oncebox migrate` runs for the whole transaction.
SELECT pg_advisory_xact_lock(hashtext('oncebox_migrate:' || %(schema)s));

-- name: migration_list
SELECT version, name, checksum FROM __S__.oncebox_migrations ORDER BY version;

-- name: migration_record
INSERT INTO __S__.oncebox_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s);
