"""Settings, on every store: a named value written once, the first writer's value kept (every
worker of a deployment must agree on, say, the secret the first one stored)."""

from __future__ import annotations

from oncebox.store import open_store
from oncebox.store.protocol import Store


def test_setting_put_if_absent_keeps_the_first_value_for_every_store_on_the_database(
    store: Store,
):
    assert store.setting_get("secret") is None
    assert store.setting_put_if_absent("secret", "first") == "first"
    other = open_store(store.url)
    try:
        assert other.setting_put_if_absent("secret", "second") == "first"
        assert other.setting_get("secret") == "first"
    finally:
        other.close()
    assert store.setting_get("secret") == "first"
    assert store.setting_get("other") is None
