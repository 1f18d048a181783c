"""The small utilities every floor may use, and which import nothing above them: the one
injectable clock, the errors, the named points tests and chaos stop at, logs, metrics, tracing,
durations, URL options, what a store can keep (`storable.py`), what is inert when shown, the
durable counters' definitions, the optional extras, and what a served oncebox trusts of a request
(`public_url.py`, `client_address.py`)."""
