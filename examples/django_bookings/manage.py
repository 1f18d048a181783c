#!/usr/bin/env python
"""Django's command-line utility for the bookings example: README.md beside it says how to run
the project, from a clone to the guest's email."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bookings_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
