-- The record of applied migrations.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: migration_table_create
CREATE TABLE IF NOT EXISTS oncebox_migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    checksum TEXT NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT;

-- name: migration_list
SELECT version, name, checksum FROM oncebox_migrations ORDER BY version;

-- name: migration_record
INSERT INTO oncebox_migrations (version, name, checksum, applied_at)
VALUES (:version, :name, :checksum, :now);
