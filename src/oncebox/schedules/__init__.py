"""Schedules: cron fires that fan out one job per eligible subject for a period, once per period
however many schedulers run. Here: the declaration, its plan, owners and SLO; the fan-out and the
trigger are verbs on the runtime (`runtime/`), the ticker a lane (`lanes/ticker.py`)."""
