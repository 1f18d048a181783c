"""`manage.py oncebox_status …`: `oncebox status` on this project, with the same options."""

from __future__ import annotations

from oncebox.contrib.django.management.commands import oncebox


class Command(oncebox.Command):
    help = "Show oncebox's status for this project (options as `oncebox status --help`)."
    prefix = ("status",)
