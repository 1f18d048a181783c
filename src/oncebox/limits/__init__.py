"""Flow control for tasks: how a lease applies the limits tasks declare (`jobs/limits.py`) on
every worker together (`plan.py`, `allocation.py`), what the limits hold back (`waiting.py`,
for `status`), and rates as people write them (`rates.py`, for the channels too)."""
