"""`manage.py oncebox_worker …`: `oncebox worker` on this project, with the same options."""

from __future__ import annotations

from oncebox.contrib.django.management.commands import oncebox


class Command(oncebox.Command):
    help = "Run an oncebox worker for this project (options as `oncebox worker --help`)."
    prefix = ("worker",)
