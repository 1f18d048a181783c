-- Settings.
-- SQLite; this folder's conventions are in store/sqlfiles.py.

-- name: setting_get
SELECT value FROM oncebox_settings WHERE name = :name;

-- name: setting_put_if_absent
INSERT INTO oncebox_settings (name, value) VALUES (:name, :value)
ON CONFLICT (name) DO NOTHING;
