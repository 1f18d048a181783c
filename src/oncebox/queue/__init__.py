"""The queue: how a job travels from enqueue to a settled row — the transport seam, the consumer
transaction (`consumer.py`, the heart of the guarantee), the lease keeper and its watchdog, and
the lease rescuer that returns the jobs of dead workers."""
