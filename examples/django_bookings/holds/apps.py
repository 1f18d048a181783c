from __future__ import annotations

from django.apps import AppConfig


class HoldsConfig(AppConfig):  # type: ignore[misc]
    name = "holds"
