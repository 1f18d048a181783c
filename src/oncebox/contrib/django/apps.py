"""The Django app: `"oncebox.contrib.django"` in INSTALLED_APPS."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.apps import AppConfig
from django.core import checks


class OnceboxConfig(AppConfig):  # type: ignore[misc]
    name = "oncebox.contrib.django"
    label = "oncebox"
    verbose_name = "oncebox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Import the modules that declare tasks, so the worker and the web process know the
        same tasks: `settings.ONCEBOX['TASKS']`, else each installed app's `tasks` module."""
        from django.utils.module_loading import autodiscover_modules  # noqa: PLC0415

        from oncebox.contrib.django.conf import read_settings  # noqa: PLC0415

        checks.register(check_settings)
        modules = read_settings().tasks
        if modules is None:
            autodiscover_modules("tasks")
        else:
            for module in modules:
                import_module(module)


def check_settings(**_kwargs: Any) -> list[checks.CheckMessage]:
    """`manage.py check`: what would stop the box from being made, as Django reports it."""
    from django.conf import settings  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    from oncebox.contrib.django.conf import database_url, read_settings  # noqa: PLC0415
    from oncebox.kernel.errors import ConfigurationError  # noqa: PLC0415

    problems: list[checks.CheckMessage] = []
    if not settings.USE_TZ:
        problems.append(checks.Error("oncebox needs USE_TZ = True", id="oncebox.E001"))
    try:
        ours = read_settings()
        database_url(connections.settings[ours.alias], ours)
    except ConfigurationError as exc:
        problems.append(checks.Error(str(exc), id="oncebox.E002"))
    return problems
