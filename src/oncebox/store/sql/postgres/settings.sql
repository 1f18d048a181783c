-- Settings.
-- PostgreSQL; this folder's conventions are in store/sqlfiles.py.

-- name: setting_get
SELECT value FROM __S__.oncebox_settings WHERE name = %(name)s;

-- name: setting_put_if_absent
INSERT INTO __S__.oncebox_settings (name, value) VALUES (%(name)s, %(value)s)
ON CONFLICT (name) DO NOTHING;
