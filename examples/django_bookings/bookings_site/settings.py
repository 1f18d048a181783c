"""Settings of the bookings example: one database, named by BOOKINGS_DB (a SQLite file by
default, or postgresql://…), oncebox's app installed beside the project's."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "bookings_site.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["oncebox.contrib.django", "holds"]
MIDDLEWARE: list[str] = []


def database(url: str) -> dict[str, object]:
    """Django's DATABASES entry for a sqlite:/// or postgresql:// URL."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        name = unquote(url.removeprefix("sqlite:///"))  # sqlite:////abs/path or sqlite:///rel
        # the test database is a file beside it: oncebox's worker opens it too
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "TEST": {"NAME": f"{name}.test"},
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES = {
    "default": database(os.environ.get("BOOKINGS_DB", f"sqlite:///{BASE_DIR / 'bookings.db'}"))
}

ONCEBOX = {
    "DATABASE": "default",
    "EMAIL": os.environ.get("ONCEBOX_EMAIL", f"file://{BASE_DIR / 'outbox'}"),
}
