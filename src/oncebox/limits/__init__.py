"""Flow control for tasks and channels: what the limits hold back (`waiting.py`, for `status`)
and rates as people write them (`rates.py`). A task's limits are declared in `jobs/limits.py`; the
lease applies them on every worker together, in the store's transaction, so the plan it takes is
a store parameter (`store/params.py`'s `LimitPlan`) and the sharing out is `store/allocation.py`."""
