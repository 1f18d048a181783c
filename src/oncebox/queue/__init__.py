"""The queue: how a job travels from enqueue to a settled row — the transport seam
(`transport.py`), what a handler sees (`context.py`), its watchdog (`watch.py`) and the claim
session a handler's ORM writes through. The consumer transaction that runs it is
`lanes/consumer.py`."""
