"""Schedules: cron fires that fan out one job per eligible subject for a period, once per period
however many schedulers run."""
