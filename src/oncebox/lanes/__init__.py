"""Every loop that runs, one file each, one shape: `XxxConfig`, `run_once() -> XxxResult`,
`run_forever(stop)`. The consumer, lease keeper and lease rescuer, dispatcher, resolver,
delivery rescuer, schedule ticker, expiry sweeper, pruner and given-up sweep; the loop they share
(`lane.py`); how they are built (`assembly.py`, the only place that builds one) and the worker
process that runs them in threads (`worker.py`). No lane imports another."""
