"""What runs the lanes: the loop every background lane shares, how a box's lanes are built, and
the worker process that runs them in threads. The lanes themselves live with the concept they
serve (the dispatcher in `outbox/`, the lease rescuer in `queue/`, …)."""
